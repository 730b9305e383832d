"""Paused job types (operators' pause/resume, table `job_type_pauses`): what a worker's
consumer polls to stop and restart consuming a queue, within seconds, in every replica."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.models import JobTypePause

PausedTypes = Callable[[], Awaitable[frozenset[str]]]


def reader(sessions: async_sessionmaker[AsyncSession]) -> PausedTypes:
    """One small read per call (the table holds one row per paused type, usually none)."""

    async def paused() -> frozenset[str]:
        async with sessions() as session:
            rows = await session.scalars(select(JobTypePause.job_type))
            return frozenset(rows.all())

    return paused
