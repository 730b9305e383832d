from __future__ import annotations

import uuid

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import User


async def provision(session: AsyncSession, external_id: str) -> tuple[uuid.UUID, bool]:
    """The user's id, creating the row the first time this external id is seen; and
    whether this transaction created it (so it is not committed yet)."""
    connection = await session.connection()
    created = (await connection.exec_driver_sql(_CREATE, (external_id,))).scalar()
    if created is not None:
        return created, True
    existing = (await connection.exec_driver_sql(_FIND, (external_id,))).scalar()
    assert existing is not None  # the conflicting row is committed: ON CONFLICT waited for it
    return existing, False


async def provision_on(connection: asyncpg.Connection, external_id: str) -> tuple[uuid.UUID, bool]:
    """`provision` in a transaction on an asyncpg connection."""
    created: uuid.UUID | None = await connection.fetchval(_CREATE, external_id)
    if created is not None:
        return created, True
    existing: uuid.UUID | None = await connection.fetchval(_FIND, external_id)
    assert existing is not None  # as in provision
    return existing, False


# Two statements, not one: the SELECT needs a snapshot taken after ON CONFLICT waited for
# a concurrent insert of the same external id to commit.
_CREATE = (
    "INSERT INTO users (external_id) VALUES ($1) ON CONFLICT (external_id) DO NOTHING RETURNING id"
)
_FIND = "SELECT id FROM users WHERE external_id = $1"


async def get(session: AsyncSession, user_id: uuid.UUID) -> User | None:
    return await session.get(User, user_id)


async def set_timezone(session: AsyncSession, user_id: uuid.UUID, timezone: str) -> None:
    user = await session.get(User, user_id)
    assert user is not None  # the caller is authenticated, so provisioned
    user.timezone = timezone
    await session.flush()
