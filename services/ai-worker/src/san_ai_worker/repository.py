"""Queries of the ai-worker."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import exists, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import Category, KnowledgeCard, Scrap, Tag, card_tags


async def get_scrap(session: AsyncSession, scrap_id: uuid.UUID) -> Scrap | None:
    return await session.get(Scrap, scrap_id)


async def card_exists(session: AsyncSession, scrap_id: uuid.UUID) -> bool:
    return bool(await session.scalar(select(exists().where(KnowledgeCard.scrap_id == scrap_id))))


async def find_or_create_category(session: AsyncSession, user_id: uuid.UUID, name: str) -> uuid.UUID:
    """Concurrency-safe: a racing insert of the same name makes ours wait, then conflict."""
    await session.execute(
        insert(Category).values(user_id=user_id, name=name).on_conflict_do_nothing(
            index_elements=["user_id", "name"]
        )
    )
    found = await session.scalar(
        select(Category.id).where(Category.user_id == user_id, Category.name == name)
    )
    assert found is not None
    return found


async def find_or_create_tags(
    session: AsyncSession, user_id: uuid.UUID, names: Sequence[str]
) -> list[uuid.UUID]:
    if not names:
        return []
    # Sorted, so two transactions inserting overlapping tag sets lock in the same order.
    ordered = sorted(set(names))
    await session.execute(
        insert(Tag)
        .values([{"user_id": user_id, "name": n} for n in ordered])
        .on_conflict_do_nothing(index_elements=["user_id", "name"])
    )
    found = await session.scalars(select(Tag.id).where(Tag.user_id == user_id, Tag.name.in_(ordered)))
    return list(found)


async def insert_card(
    session: AsyncSession,
    *,
    scrap: Scrap,
    category_id: uuid.UUID | None,
    title: str,
    summary: str,
    embedding: Sequence[float],
) -> uuid.UUID | None:
    """None when the scrap already has its card (a duplicate delivery got there first)."""
    return await session.scalar(
        insert(KnowledgeCard)
        .values(
            user_id=scrap.user_id,
            scrap_id=scrap.id,
            category_id=category_id,
            title=title,
            summary=summary,
            embedding=list(embedding),
        )
        .on_conflict_do_nothing(index_elements=["scrap_id"])
        .returning(KnowledgeCard.id)
    )


async def link_tags(session: AsyncSession, card_id: uuid.UUID, tag_ids: Sequence[uuid.UUID]) -> None:
    if tag_ids:
        await session.execute(
            insert(card_tags)
            .values([{"card_id": card_id, "tag_id": t} for t in tag_ids])
            .on_conflict_do_nothing()
        )


async def set_refined_content(session: AsyncSession, scrap_id: uuid.UUID, refined: str) -> None:
    await session.execute(
        update(Scrap)
        .where(Scrap.id == scrap_id)
        .values(refined_content=refined, refined_at=func.now(), updated_at=func.now())
    )
