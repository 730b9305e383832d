"""The deployment's identity: made by the migrations (table `deployment`), carried by
every job message (header `x-san-deployment`, stamped by the relay), checked by every
worker. See docs/architecture.md, "Deployment identity"."""

from __future__ import annotations

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

DEPLOYMENT_HEADER = "x-san-deployment"

_IDENTITY = text("SELECT deployment_id FROM deployment")


class NoIdentity(RuntimeError):
    """The database has no deployment row: its migrations have not run."""


async def identity(sessions: async_sessionmaker[AsyncSession]) -> str:
    """This deployment's id, as its database holds it."""
    async with sessions() as session:
        found = await session.scalar(_IDENTITY)
    if found is None:
        raise NoIdentity("the database has no deployment identity; run the migrations")
    return str(found)


async def identity_on(connection: asyncpg.Connection) -> str:
    """The same, read on an asyncpg connection."""
    found = await connection.fetchval(str(_IDENTITY))
    if found is None:
        raise NoIdentity("the database has no deployment identity; run the migrations")
    return str(found)


async def identity_in(session: AsyncSession) -> str:
    """The same, read in the caller's session."""
    found = await session.scalar(_IDENTITY)
    if found is None:
        raise NoIdentity("the database has no deployment identity; run the migrations")
    return str(found)
