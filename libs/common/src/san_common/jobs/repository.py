"""Queries on `async_jobs` shared by the API, the workers and recovery."""

from __future__ import annotations

import uuid
from datetime import timedelta

from sqlalchemy import func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.types import ACTIVE_STATUSES, JobStatus, JobType
from san_common.models import AsyncJob

_NOW = func.now()


async def get_for_user(
    session: AsyncSession, job_id: uuid.UUID, user_id: uuid.UUID
) -> AsyncJob | None:
    return await session.scalar(
        select(AsyncJob).where(AsyncJob.job_id == job_id, AsyncJob.user_id == user_id)
    )


async def find_active(
    session: AsyncSession, target_id: uuid.UUID, job_type: JobType
) -> AsyncJob | None:
    return await session.scalar(
        select(AsyncJob).where(
            AsyncJob.target_id == target_id,
            AsyncJob.job_type == job_type.value,
            AsyncJob.status.in_([s.value for s in ACTIVE_STATUSES]),
        )
    )


async def claim(
    session: AsyncSession,
    job_id: uuid.UUID,
    worker_id: str,
    lease: timedelta,
    *,
    reclaim_own: bool = False,
) -> AsyncJob | None:
    """PENDING → PROCESSING, or take over a PROCESSING job whose worker's lease expired
    (or, with `reclaim_own`, that `worker_id` itself holds and knows it no longer runs).

    Returns None when the job is not claimable (done, owned by a live worker, unknown):
    the caller acks and skips the message, which makes redeliveries harmless.
    """
    processing = AsyncJob.status == JobStatus.PROCESSING.value
    takeover = processing & (AsyncJob.lease_expires_at < _NOW)
    if reclaim_own:
        takeover = takeover | (processing & (AsyncJob.worker_id == worker_id))
    return await session.scalar(
        update(AsyncJob)
        .where(
            AsyncJob.job_id == job_id,
            or_(AsyncJob.status == JobStatus.PENDING.value, takeover),
        )
        .values(
            status=JobStatus.PROCESSING.value,
            worker_id=worker_id,
            lease_expires_at=_NOW + lease,
            started_at=_NOW,
            updated_at=_NOW,
        )
        .returning(AsyncJob)
    )


async def extend_lease(
    session: AsyncSession, job_id: uuid.UUID, worker_id: str, lease: timedelta
) -> bool:
    result = await session.execute(
        _owned(job_id, worker_id).values(lease_expires_at=_NOW + lease, updated_at=_NOW)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def complete(session: AsyncSession, job_id: uuid.UUID, worker_id: str) -> bool:
    """PROCESSING → COMPLETED, only while this worker still owns the job."""
    result = await session.execute(
        _owned(job_id, worker_id).values(
            status=JobStatus.COMPLETED.value,
            error_message=None,
            finished_at=_NOW,
            updated_at=_NOW,
            lease_expires_at=None,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def fail(session: AsyncSession, job_id: uuid.UUID, worker_id: str, message: str) -> bool:
    """PROCESSING → FAILED with the cause chain, only while this worker owns the job."""
    result = await session.execute(
        _owned(job_id, worker_id).values(
            status=JobStatus.FAILED.value,
            error_message=message,
            finished_at=_NOW,
            updated_at=_NOW,
            lease_expires_at=None,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def release(session: AsyncSession, job_id: uuid.UUID, worker_id: str) -> bool:
    """PROCESSING → PENDING, for a worker that shuts down before finishing the job."""
    result = await session.execute(
        _owned(job_id, worker_id).values(
            status=JobStatus.PENDING.value,
            worker_id=None,
            lease_expires_at=None,
            started_at=None,
            updated_at=_NOW,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def _owned(job_id: uuid.UUID, worker_id: str):  # type: ignore[no-untyped-def]
    return update(AsyncJob).where(
        AsyncJob.job_id == job_id,
        AsyncJob.status == JobStatus.PROCESSING.value,
        AsyncJob.worker_id == worker_id,
    )
