from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import User


async def provision(session: AsyncSession, external_id: str) -> tuple[uuid.UUID, bool]:
    """The user's id, creating the row the first time this external id is seen; and
    whether this transaction created it (so it is not committed yet)."""
    created: uuid.UUID | None = await session.scalar(
        insert(User)
        .values(external_id=external_id)
        .on_conflict_do_nothing(index_elements=["external_id"])
        .returning(User.id)
    )
    if created is not None:
        return created, True
    existing: uuid.UUID | None = await session.scalar(
        select(User.id).where(User.external_id == external_id)
    )
    assert existing is not None  # the conflicting row is committed: ON CONFLICT waited for it
    return existing, False


async def get(session: AsyncSession, user_id: uuid.UUID) -> User | None:
    return await session.get(User, user_id)


async def set_timezone(session: AsyncSession, user_id: uuid.UUID, timezone: str) -> None:
    user = await session.get(User, user_id)
    assert user is not None  # the caller is authenticated, so provisioned
    user.timezone = timezone
    await session.flush()
