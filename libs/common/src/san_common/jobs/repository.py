"""Queries on `async_jobs` shared by the API, the workers, the relay and recovery.

Fencing: a worker's claim increments `tries`; every later write of that try (heartbeat,
complete, fail, retry, release) matches `status = 'PROCESSING' AND tries = <its try>`. A
worker whose try was taken over (its lease expired and someone else claimed or rescued
the job) therefore changes nothing, and learns it from the returned row count.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import Update, and_, case, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.errors import MAX_ERROR_MESSAGE
from san_common.jobs import outbox, registry
from san_common.jobs.types import ACTIVE_STATUSES, JobStatus, JobType
from san_common.models import AsyncJob, AsyncJobTry

_NOW = func.now()
_PENDING, _PROCESSING = JobStatus.PENDING.value, JobStatus.PROCESSING.value


class TryOutcome(StrEnum):
    """How a try ended (`async_job_tries.outcome`)."""

    COMPLETED = "completed"
    FAILED = "failed"
    RETRY = "retry"  # a transient failure; the next try is scheduled
    RATE_LIMITED = "rate_limited"  # the remote side asked us to wait; no try spent
    LEASE_LOST = "lease_lost"  # the worker stopped renewing its lease; taken over
    RELEASED = "released"  # given back on shutdown or a database outage; no try spent


# Tries that count against a job's retry budget. A lost lease counts: a job that keeps
# killing its worker must end, not loop.
SPENT_OUTCOMES = (TryOutcome.RETRY.value, TryOutcome.LEASE_LOST.value)


async def get_for_user(
    session: AsyncSession, job_id: uuid.UUID, user_id: uuid.UUID
) -> AsyncJob | None:
    return await session.scalar(
        select(AsyncJob).where(AsyncJob.job_id == job_id, AsyncJob.user_id == user_id)
    )


async def find_active(
    session: AsyncSession, target_id: uuid.UUID, job_type: JobType | str
) -> AsyncJob | None:
    return await session.scalar(
        select(AsyncJob).where(
            AsyncJob.target_id == target_id,
            AsyncJob.job_type == str(job_type),
            AsyncJob.status.in_([s.value for s in ACTIVE_STATUSES]),
        )
    )


@dataclass(frozen=True)
class JobState:
    """What a worker that could not claim a job needs to know to decide what to do."""

    status: str
    lease_expires_at: datetime | None
    next_attempt_at: datetime | None
    now: datetime


async def state(session: AsyncSession, job_id: uuid.UUID) -> JobState | None:
    row = (
        await session.execute(
            select(
                AsyncJob.status, AsyncJob.lease_expires_at, AsyncJob.next_attempt_at, _NOW
            ).where(AsyncJob.job_id == job_id)
        )
    ).first()
    return None if row is None else JobState(*row)


async def claim(
    session: AsyncSession,
    job_id: uuid.UUID,
    worker_id: str,
    lease: timedelta,
    *,
    reclaim_own: bool = False,
) -> AsyncJob | None:
    """A new try: PENDING and due → PROCESSING, or take over a PROCESSING job whose lease
    expired (or, with `reclaim_own`, that `worker_id` itself holds and knows it no longer
    runs). `tries` goes up by one: the new try's fencing token.

    Returns None when the job is not claimable (done, held under a live lease, waiting for
    its next try, unknown); `state` tells which.
    """
    processing = AsyncJob.status == _PROCESSING
    takeover = processing & (AsyncJob.lease_expires_at < _NOW)
    if reclaim_own:
        takeover = takeover | (processing & (AsyncJob.worker_id == worker_id))
    due = (AsyncJob.status == _PENDING) & (
        AsyncJob.next_attempt_at.is_(None) | (AsyncJob.next_attempt_at <= _NOW)
    )
    job = await session.scalar(
        update(AsyncJob)
        .where(AsyncJob.job_id == job_id, or_(due, takeover))
        .values(
            status=_PROCESSING,
            tries=AsyncJob.tries + 1,
            worker_id=worker_id,
            lease_expires_at=_NOW + lease,
            next_attempt_at=None,
            started_at=_NOW,
            updated_at=_NOW,
        )
        .returning(AsyncJob)
        .execution_options(populate_existing=True)
    )
    if job is None:
        return None
    # A try taken over has no outcome yet: its worker vanished or stalled — or, when it is
    # this very worker (`reclaim_own`), an outage interrupted it: that spends no try.
    await session.execute(
        update(AsyncJobTry)
        .where(AsyncJobTry.job_id == job_id, AsyncJobTry.outcome.is_(None))
        .values(
            outcome=case(
                (AsyncJobTry.worker_id == worker_id, TryOutcome.RELEASED.value),
                else_=TryOutcome.LEASE_LOST.value,
            ),
            error="taken over",
            finished_at=_NOW,
        )
    )
    await session.execute(
        insert(AsyncJobTry).values(job_id=job_id, try_no=job.tries, worker_id=worker_id)
    )
    return job


async def spent_tries(session: AsyncSession, job_id: uuid.UUID) -> int:
    """Tries that count against the retry budget (see `SPENT_OUTCOMES`)."""
    count = await session.scalar(
        select(func.count())
        .select_from(AsyncJobTry)
        .where(AsyncJobTry.job_id == job_id, AsyncJobTry.outcome.in_(SPENT_OUTCOMES))
    )
    return int(count or 0)


async def extend_lease(
    session: AsyncSession, job_id: uuid.UUID, try_no: int, lease: timedelta
) -> bool:
    result = await session.execute(
        _owned(job_id, try_no).values(lease_expires_at=_NOW + lease, updated_at=_NOW)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def complete(session: AsyncSession, job_id: uuid.UUID, try_no: int) -> bool:
    """PROCESSING → COMPLETED, only while try `try_no` still holds the job."""
    result = await session.execute(
        _owned(job_id, try_no).values(
            status=JobStatus.COMPLETED.value,
            error_message=None,
            error_summary=None,
            checkpoint=None,
            finished_at=_NOW,
            updated_at=_NOW,
            lease_expires_at=None,
        )
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    await _finish_try(session, job_id, try_no, TryOutcome.COMPLETED, None)
    return True


async def fail(
    session: AsyncSession, job_id: uuid.UUID, try_no: int, message: str, summary: str
) -> bool:
    """PROCESSING → FAILED with the cause chain, only while try `try_no` holds the job."""
    message = message[:MAX_ERROR_MESSAGE]
    result = await session.execute(
        _owned(job_id, try_no).values(
            status=JobStatus.FAILED.value,
            error_message=message,
            last_error=message,
            error_summary=summary,
            finished_at=_NOW,
            updated_at=_NOW,
            lease_expires_at=None,
        )
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    await _finish_try(session, job_id, try_no, TryOutcome.FAILED, message)
    return True


async def retry_later(
    session: AsyncSession,
    job_id: uuid.UUID,
    try_no: int,
    *,
    delay: timedelta,
    error: str,
    summary: str,
    outcome: TryOutcome = TryOutcome.RETRY,
) -> datetime | None:
    """End try `try_no` with a transient failure: the job goes back to PENDING with
    `next_attempt_at`, and its next message is added to the outbox, due at that time —
    all in the caller's transaction, so the job is never waiting without a message.
    Returns the time of the next try, None when the try no longer holds the job."""
    error = error[:MAX_ERROR_MESSAGE]
    job = await session.scalar(
        _owned(job_id, try_no)
        .values(
            status=_PENDING,
            worker_id=None,
            lease_expires_at=None,
            next_attempt_at=_NOW + delay,
            last_error=error,
            error_summary=summary,
            updated_at=_NOW,
        )
        .returning(AsyncJob)
        .execution_options(populate_existing=True)
    )
    if job is None:
        return None
    await _finish_try(session, job_id, try_no, outcome, error)
    assert job.next_attempt_at is not None
    await outbox.add_job_message(session, job, available_at=job.next_attempt_at)
    return job.next_attempt_at


async def release(
    session: AsyncSession, job_id: uuid.UUID, try_no: int, reason: str = "released"
) -> bool:
    """PROCESSING → PENDING without spending a try (shutdown, database outage). The caller
    requeues the job's message, so no outbox row is added."""
    result = await session.execute(
        _owned(job_id, try_no).values(
            status=_PENDING,
            worker_id=None,
            lease_expires_at=None,
            started_at=None,
            updated_at=_NOW,
        )
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    await _finish_try(session, job_id, try_no, TryOutcome.RELEASED, reason)
    return True


async def save_checkpoint(
    session: AsyncSession, job_id: uuid.UUID, try_no: int, checkpoint: dict[str, object]
) -> bool:
    """Keep a partial result of try `try_no` for the tries after it (fenced too)."""
    result = await session.execute(
        _owned(job_id, try_no).values(checkpoint=checkpoint, updated_at=_NOW)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def schedule_message(session: AsyncSession, job_id: uuid.UUID, at: datetime) -> bool:
    """A new message for an active job, due at `at` (a delivery that arrived while another
    worker held the job comes back when that worker's lease runs out)."""
    job = await session.get(AsyncJob, job_id)
    if job is None or job.status not in (_PENDING, _PROCESSING):
        return False
    await outbox.add_job_message(session, job, available_at=at)
    return True


async def make_available(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    at: datetime | None = None,
    from_statuses: tuple[str, ...] = (JobStatus.FAILED.value,),
    new_attempt: bool = False,
    reason: str | None = None,
) -> bool:
    """Make a job claimable again under the same job id, with a new outbox message (due at
    `at`, or now): an operator's "retry now", or recovery reviving a ghost (`new_attempt`:
    `attempt` + 1, the retry cap's count; `reason` becomes `last_error`). Only from
    `from_statuses`; an open try ends `lease_lost` and is fenced out. Raises IntegrityError
    (the partial unique index) if the target has another active job — run it in a
    savepoint when that can happen."""
    values: dict[str, object] = {
        "status": _PENDING,
        "worker_id": None,
        "lease_expires_at": None,
        "started_at": None,
        "finished_at": None,
        "updated_at": _NOW,
        "next_attempt_at": at,
    }
    if new_attempt:
        values["attempt"] = AsyncJob.attempt + 1
    if reason is not None:
        values["last_error"] = reason[:MAX_ERROR_MESSAGE]
        values["error_summary"] = "restarted: its worker was lost or its message never arrived"
    job = await session.scalar(
        update(AsyncJob)
        .where(AsyncJob.job_id == job_id, AsyncJob.status.in_(from_statuses))
        .values(**values)
        .returning(AsyncJob)
        .execution_options(populate_existing=True)
    )
    if job is None:
        return False
    await _finish_open_tries(session, job_id, TryOutcome.LEASE_LOST, "made available again")
    spec = registry.find(job.job_type)
    if spec is not None and spec.mirror is not None:
        await spec.mirror.set(session, job.target_id, _PENDING)
    await outbox.add_job_message(session, job, available_at=at)
    return True


@dataclass(frozen=True)
class Rescued:
    job_id: uuid.UUID
    job_type: str
    target_id: uuid.UUID
    worker_id: str | None
    spent: int


async def rescue_expired(session: AsyncSession, *, limit: int) -> list[Rescued]:
    """PROCESSING jobs whose lease expired → PENDING under the same job id, each with a new
    outbox message. `SKIP LOCKED` keeps several rescuers (relay replicas) and a worker
    settling the job at the same moment from colliding. The next claim increments `tries`,
    so the vanished try is fenced out; its try row ends `lease_lost`. Returns what was
    rescued with the tries each job has spent, so the caller can give up on poison jobs."""
    expired = (
        select(AsyncJob.job_id, AsyncJob.worker_id)
        .where(AsyncJob.status == _PROCESSING, AsyncJob.lease_expires_at < _NOW)
        .order_by(AsyncJob.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("expired")
    )
    rows = (
        await session.execute(
            update(AsyncJob)
            .where(AsyncJob.job_id == expired.c.job_id)
            .values(
                status=_PENDING,
                worker_id=None,
                lease_expires_at=None,
                started_at=None,
                last_error=func.concat(
                    "lease expired (worker ", func.coalesce(expired.c.worker_id, "?"), ")"
                ),
                updated_at=_NOW,
            )
            .returning(AsyncJob, expired.c.worker_id)
            .execution_options(populate_existing=True)
        )
    ).all()
    rescued: list[Rescued] = []
    for job, worker_id in rows:
        await _finish_open_tries(session, job.job_id, TryOutcome.LEASE_LOST, "lease expired")
        await outbox.add_job_message(session, job)
        rescued.append(
            Rescued(
                job.job_id,
                job.job_type,
                job.target_id,
                worker_id,
                await spent_tries(session, job.job_id),
            )
        )
    return rescued


async def give_up(session: AsyncSession, job_id: uuid.UUID, message: str, summary: str) -> bool:
    """PENDING → FAILED (a rescued job out of tries: it kept losing its worker)."""
    message = message[:MAX_ERROR_MESSAGE]
    result = await session.execute(
        update(AsyncJob)
        .where(AsyncJob.job_id == job_id, AsyncJob.status == _PENDING)
        .values(
            status=JobStatus.FAILED.value,
            error_message=message,
            last_error=message,
            error_summary=summary,
            finished_at=_NOW,
            updated_at=_NOW,
            next_attempt_at=None,
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def tries_of(session: AsyncSession, job_id: uuid.UUID) -> list[AsyncJobTry]:
    return list(
        await session.scalars(
            select(AsyncJobTry).where(AsyncJobTry.job_id == job_id).order_by(AsyncJobTry.try_no)
        )
    )


def _owned(job_id: uuid.UUID, try_no: int) -> Update:
    # The fencing condition: this try, and only while it still holds the job.
    return update(AsyncJob).where(
        AsyncJob.job_id == job_id,
        AsyncJob.status == _PROCESSING,
        AsyncJob.tries == try_no,
    )


async def _finish_try(
    session: AsyncSession, job_id: uuid.UUID, try_no: int, outcome: TryOutcome, error: str | None
) -> None:
    await session.execute(
        update(AsyncJobTry)
        .where(AsyncJobTry.job_id == job_id, AsyncJobTry.try_no == try_no)
        .values(outcome=outcome.value, error=error, finished_at=_NOW)
    )


async def _finish_open_tries(
    session: AsyncSession, job_id: uuid.UUID, outcome: TryOutcome, error: str
) -> None:
    await session.execute(
        update(AsyncJobTry)
        .where(
            and_(AsyncJobTry.job_id == job_id, AsyncJobTry.outcome.is_(None)),
        )
        .values(outcome=outcome.value, error=error, finished_at=_NOW)
    )
