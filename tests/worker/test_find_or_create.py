"""Category and tag find-or-create under concurrency (docs/reference/job-rules.md §3.1): many
workers analysing cards of one user at once must neither fail on unique violations nor deadlock, and
must end with one row per name."""

from __future__ import annotations

import asyncio
import random
import uuid

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_ai_worker import repository
from san_common.models import Category, Tag, User

TAGS = ["python", "asyncio", "postgres", "rabbitmq", "outbox", "pgvector"]


async def _user(sessions: async_sessionmaker[AsyncSession]) -> uuid.UUID:
    async with sessions() as session, session.begin():
        user_id = await session.scalar(
            insert(User).values(external_id=f"foc-{uuid.uuid4().hex}").returning(User.id)
        )
    assert user_id is not None
    return user_id


async def test_concurrent_find_or_create_yields_one_row_per_name(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    user_id = await _user(sessions)
    start = asyncio.Event()

    async def analyse(seed: int) -> tuple[uuid.UUID, dict[str, uuid.UUID]]:
        names = random.Random(seed).sample(TAGS, 4)  # overlapping sets, in different orders
        await start.wait()
        async with sessions() as session, session.begin():
            category = await repository.find_or_create_category(session, user_id, "programming")
            tag_ids = await repository.find_or_create_tags(session, user_id, names)
            rows = await session.execute(select(Tag.name, Tag.id).where(Tag.id.in_(tag_ids)))
            return category, {name: tag_id for name, tag_id in rows}

    tasks = [asyncio.create_task(analyse(seed)) for seed in range(16)]
    await asyncio.sleep(0)  # every task is parked on the event: they start together
    start.set()
    results = await asyncio.gather(*tasks)

    assert len({category for category, _ in results}) == 1
    by_name: dict[str, set[uuid.UUID]] = {}
    for _, tags in results:
        for name, tag_id in tags.items():
            by_name.setdefault(name, set()).add(tag_id)
    assert all(len(ids) == 1 for ids in by_name.values()), by_name
    async with sessions() as session:
        tag_rows = await session.scalar(
            select(func.count()).select_from(Tag).where(Tag.user_id == user_id)
        )
        category_rows = await session.scalar(
            select(func.count()).select_from(Category).where(Category.user_id == user_id)
        )
    assert tag_rows == len(by_name)
    assert category_rows == 1
