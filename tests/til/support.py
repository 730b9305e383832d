"""Helpers of the TIL suite: users with a time zone, cards on chosen days, row counts."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert

from san_api.auth.tokens import mint
from san_common.models import (
    AsyncJob,
    Category,
    DailySummary,
    KnowledgeCard,
    OutboxMessage,
    RecallQuiz,
    RecallQuizGeneration,
    Scrap,
    Tag,
    User,
    card_tags,
    daily_summary_cards,
)
from san_common.models.base import EMBEDDING_DIMENSIONS
from tests.api.support import Sessions
from tests.conftest import JWT_SECRET


@dataclass(frozen=True)
class TestUser:
    __test__ = False  # not a test class, whatever pytest thinks of the name

    user_id: uuid.UUID
    subject: str
    zone: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {mint(JWT_SECRET, self.subject)}"}


async def make_user(sessions: Sessions, zone: str = "UTC") -> TestUser:
    subject = f"til-{uuid.uuid4().hex}"
    async with sessions() as session, session.begin():
        user_id = await session.scalar(
            insert(User).values(external_id=subject, timezone=zone).returning(User.id)
        )
    assert user_id is not None
    return TestUser(user_id, subject, zone)


def at_noon(day: date, zone: str = "UTC") -> datetime:
    return datetime.combine(day, time(12), tzinfo=ZoneInfo(zone))


def days_ago(n: int) -> date:
    """A day safely in the past in every time zone (UTC today minus n, n ≥ 2)."""
    return datetime.now(UTC).date() - timedelta(days=n)


def unit_vector(axis: int) -> list[float]:
    vector = [0.0] * EMBEDDING_DIMENSIONS
    vector[axis] = 1.0
    return vector


async def add_card(
    sessions: Sessions,
    user: TestUser,
    created_at: datetime,
    *,
    title: str | None = None,
    embedding: Sequence[float] | None = None,
    tags: Sequence[str] = (),
    category: str | None = None,
) -> uuid.UUID:
    """A knowledge card (and its scrap) as CARD_ANALYSIS stores it, created at `created_at`."""
    title = title or f"card {uuid.uuid4().hex[:8]}"
    content = f"{title} {uuid.uuid4()}"
    async with sessions() as session, session.begin():
        scrap_id = await session.scalar(
            insert(Scrap)
            .values(
                user_id=user.user_id,
                content=content,
                content_hash=hashlib.sha256(content.encode()).hexdigest(),
                created_at=created_at,
            )
            .returning(Scrap.id)
        )
        category_id = None
        if category:
            category_id = await session.scalar(
                insert(Category)
                .values(user_id=user.user_id, name=category)
                .on_conflict_do_update(index_elements=["user_id", "name"], set_={"name": category})
                .returning(Category.id)
            )
        card_id = await session.scalar(
            insert(KnowledgeCard)
            .values(
                user_id=user.user_id,
                scrap_id=scrap_id,
                category_id=category_id,
                title=title,
                summary=f"What {title} taught me.",
                embedding=list(embedding or unit_vector(1 + uuid.uuid4().int % 1000)),
                created_at=created_at,
            )
            .returning(KnowledgeCard.id)
        )
        for name in tags:
            tag_id = await session.scalar(
                insert(Tag)
                .values(user_id=user.user_id, name=name)
                .on_conflict_do_update(index_elements=["user_id", "name"], set_={"name": name})
                .returning(Tag.id)
            )
            await session.execute(insert(card_tags).values(card_id=card_id, tag_id=tag_id))
    assert card_id is not None
    return card_id


@dataclass(frozen=True)
class Footprint:
    """What one user has in the tables this suite writes."""

    summaries: int
    generations: int
    quizzes: int
    jobs: int
    outbox: int


async def footprint(sessions: Sessions, user: TestUser) -> Footprint:
    async def count(query) -> int:  # type: ignore[no-untyped-def]
        return int(await session.scalar(query) or 0)

    async with sessions() as session:
        return Footprint(
            summaries=await count(
                select(func.count())
                .select_from(DailySummary)
                .where(DailySummary.user_id == user.user_id)
            ),
            generations=await count(
                select(func.count())
                .select_from(RecallQuizGeneration)
                .where(RecallQuizGeneration.user_id == user.user_id)
            ),
            quizzes=await count(
                select(func.count())
                .select_from(RecallQuiz)
                .join(RecallQuizGeneration)
                .where(RecallQuizGeneration.user_id == user.user_id)
            ),
            jobs=await count(
                select(func.count()).select_from(AsyncJob).where(AsyncJob.user_id == user.user_id)
            ),
            outbox=await count(
                select(func.count())
                .select_from(OutboxMessage)
                .where(OutboxMessage.body["user_id"].astext == str(user.user_id))
            ),
        )


async def add_summary(
    sessions: Sessions,
    user: TestUser,
    day: date,
    *,
    status: str = "COMPLETED",
    embedding: Sequence[float] | None = None,
    sources: Sequence[uuid.UUID] = (),
) -> uuid.UUID:
    """A `daily_summaries` row as a completed TIL_GENERATION leaves it (or as given)."""
    done = status == "COMPLETED"
    async with sessions() as session, session.begin():
        summary_id = await session.scalar(
            insert(DailySummary)
            .values(
                user_id=user.user_id,
                target_date=day,
                status=status,
                title=f"TIL {day}" if done else None,
                til_markdown=f"# TIL {day}\n" if done else None,
                embedding=list(embedding) if embedding is not None else None,
                completed_at=func.now() if done else None,
            )
            .returning(DailySummary.id)
        )
        if sources:
            await session.execute(
                insert(daily_summary_cards).values(
                    [{"summary_id": summary_id, "card_id": card} for card in sources]
                )
            )
    assert summary_id is not None
    return summary_id
