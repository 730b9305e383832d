"""Outbox queries of the relay."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import OutboxMessage


async def claim_unpublished(session: AsyncSession, limit: int) -> Sequence[OutboxMessage]:
    """Lock a batch of unpublished rows. SKIP LOCKED lets replicas take disjoint batches;
    the locks last until the caller's transaction ends."""
    result = await session.scalars(
        select(OutboxMessage)
        .where(OutboxMessage.published_at.is_(None))
        .order_by(OutboxMessage.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return result.all()


async def mark_published(session: AsyncSession, ids: Sequence[int]) -> None:
    if ids:
        await session.execute(
            update(OutboxMessage).where(OutboxMessage.id.in_(ids)).values(published_at=func.now())
        )


async def delete_published_before(session: AsyncSession, retention: timedelta, limit: int) -> int:
    doomed = (
        select(OutboxMessage.id)
        .where(OutboxMessage.published_at < func.now() - retention)
        .limit(limit)
        .scalar_subquery()
    )
    result = await session.execute(delete(OutboxMessage).where(OutboxMessage.id.in_(doomed)))
    return int(result.rowcount)  # type: ignore[attr-defined]


async def backlog(session: AsyncSession) -> tuple[int, float]:
    """(unpublished rows, age in seconds of the oldest one)."""
    row = (
        await session.execute(
            select(
                func.count(),
                func.coalesce(
                    func.extract("epoch", func.now() - func.min(OutboxMessage.created_at)), 0
                ),
            ).where(OutboxMessage.published_at.is_(None))
        )
    ).one()
    return int(row[0]), float(row[1])
