from __future__ import annotations

import uuid

from sqlalchemy import exists, select
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import KnowledgeCard, Scrap


async def insert_if_absent(
    session: AsyncSession, user_id: uuid.UUID, content: str, content_hash: str
) -> uuid.UUID | None:
    """Insert the scrap unless the user already has this content; None if they do.

    Concurrent identical inserts serialize on the unique index: the loser waits for the
    winner's commit and then sees the conflict.
    """
    connection = await session.connection()
    result = await connection.exec_driver_sql(_INSERT_IF_ABSENT, (user_id, content, content_hash))
    scrap_id: uuid.UUID | None = result.scalar()
    return scrap_id


# Written as SQL, prepared once per connection: the ORM's insert machinery cost more of a
# `POST /scraps` than the statement did (docs/performance.md).
_INSERT_IF_ABSENT = """
INSERT INTO scraps (user_id, content, content_hash) VALUES ($1, $2, $3)
ON CONFLICT (user_id, content_hash) DO NOTHING
RETURNING id
"""


async def find_by_hash(
    session: AsyncSession, user_id: uuid.UUID, content_hash: str
) -> uuid.UUID | None:
    return await session.scalar(
        select(Scrap.id).where(Scrap.user_id == user_id, Scrap.content_hash == content_hash)
    )


async def has_card(session: AsyncSession, scrap_id: uuid.UUID) -> bool:
    return bool(await session.scalar(select(exists().where(KnowledgeCard.scrap_id == scrap_id))))
