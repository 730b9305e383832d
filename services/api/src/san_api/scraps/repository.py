from __future__ import annotations

import uuid

from sqlalchemy import exists, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import KnowledgeCard, Scrap


async def insert_if_absent(
    session: AsyncSession, user_id: uuid.UUID, content: str, content_hash: str
) -> uuid.UUID | None:
    """Insert the scrap unless the user already has this content; None if they do.

    Concurrent identical inserts serialize on the unique index: the loser waits for the
    winner's commit and then sees the conflict.
    """
    return await session.scalar(
        insert(Scrap)
        .values(user_id=user_id, content=content, content_hash=content_hash)
        .on_conflict_do_nothing(index_elements=["user_id", "content_hash"])
        .returning(Scrap.id)
    )


async def find_by_hash(
    session: AsyncSession, user_id: uuid.UUID, content_hash: str
) -> uuid.UUID | None:
    return await session.scalar(
        select(Scrap.id).where(Scrap.user_id == user_id, Scrap.content_hash == content_hash)
    )


async def has_card(session: AsyncSession, scrap_id: uuid.UUID) -> bool:
    return bool(await session.scalar(select(exists().where(KnowledgeCard.scrap_id == scrap_id))))
