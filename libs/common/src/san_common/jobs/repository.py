"""Queries on `async_jobs` shared by the API, the workers, the relay and recovery.

Fencing: a worker's claim increments `tries`; every later write of that try (heartbeat,
complete, fail, retry, release) matches `status = 'PROCESSING' AND tries = <its try>`. A
worker whose try was taken over (its lease expired and someone else claimed or rescued
the job) therefore changes nothing, and learns it from the returned row count.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import asyncpg
from sqlalchemy import Update, and_, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import configure_mappers
from sqlalchemy.orm.instrumentation import manager_of_class

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


# The hot path's two statements, written once as SQL: a claim or a completion is one round
# trip for a whole batch of jobs, the mirrored status of their target rows included (the
# ORM's UPDATE machinery cost more CPU per job than the database did:
# benchmarks/results/platform.md).
# `claim` and `complete` below are these statements for one job, so every caller goes
# through the same fencing. `{mirrors}` is filled from the registry (`_with_mirrors`).
_CLAIM_BATCH = """
WITH asked AS (
    SELECT DISTINCT unnest($1::uuid[]) AS job_id
), claimed AS (
    UPDATE async_jobs AS j
    SET status = 'PROCESSING', tries = j.tries + 1, worker_id = $2,
        lease_expires_at = now() + make_interval(secs => $3),
        next_attempt_at = NULL, started_at = now(), updated_at = now()
    FROM asked
    WHERE j.job_id = asked.job_id
      -- A CASE, not ORs of `status = …`: no index on status can serve it, so the rows are
      -- found by their ids whatever the statistics say. Under the statistics of a quiet
      -- table (few PENDING rows) the ORs had the planner read every PENDING row of a
      -- backlog through the status indexes to claim a batch of them (docs/scaling.md).
      AND CASE j.status
        WHEN 'PENDING' THEN j.next_attempt_at IS NULL OR j.next_attempt_at <= now()
        WHEN 'PROCESSING' THEN j.lease_expires_at < now() OR ($4 AND j.worker_id = $2)
        ELSE false
      END
    RETURNING j.*
), taken_over AS (
    -- A try taken over has no outcome yet: its worker vanished or stalled — or, when it is
    -- this very worker (`reclaim_own`), an outage interrupted it: that spends no try.
    UPDATE async_job_tries AS t
    SET outcome = CASE WHEN t.worker_id = $2 THEN 'released' ELSE 'lease_lost' END,
        error = 'taken over', finished_at = now()
    FROM claimed
    -- the open try of a PROCESSING job is its latest (`tries` before this claim)
    WHERE t.job_id = claimed.job_id AND t.try_no = claimed.tries - 1 AND t.outcome IS NULL
    RETURNING t.job_id, t.outcome
), opened AS (
    INSERT INTO async_job_tries (job_id, try_no, worker_id)
    SELECT job_id, tries, $2 FROM claimed
){mirrors}
SELECT asked.job_id AS asked_id, claimed.*,
    now() AS now_, state.status AS state_status,
    state.lease_expires_at AS state_lease_expires_at,
    state.next_attempt_at AS state_next_attempt_at,
    -- every statement of a WITH sees one snapshot: the try just taken over is counted
    -- from `taken_over`, not from the table
    CASE WHEN claimed.tries > 1 THEN
        (SELECT count(*) FROM async_job_tries AS t
            WHERE t.job_id = claimed.job_id AND t.outcome IN ('retry', 'lease_lost'))
        + (SELECT count(*) FROM taken_over
            WHERE taken_over.job_id = claimed.job_id AND taken_over.outcome = 'lease_lost')
    ELSE 0 END AS spent_,
    CASE WHEN claimed.tries > 1 THEN
        (SELECT count(*) FROM async_job_tries AS t
            WHERE t.job_id = claimed.job_id AND t.outcome = 'rate_limited')
    ELSE 0 END AS waits_
FROM asked
LEFT JOIN claimed ON claimed.job_id = asked.job_id
LEFT JOIN async_jobs AS state ON state.job_id = asked.job_id
"""

_COMPLETE_BATCH = """
WITH done AS (
    UPDATE async_jobs AS j
    SET status = 'COMPLETED', error_message = NULL, error_summary = NULL, checkpoint = NULL,
        finished_at = now(), updated_at = now(), lease_expires_at = NULL
    FROM unnest($1::uuid[], $2::integer[]) AS mine(job_id, try_no)
    WHERE j.job_id = mine.job_id
      AND j.status = 'PROCESSING'
      AND j.tries = mine.try_no
    RETURNING j.job_id, j.tries, j.job_type, j.target_id
), ended AS (
    UPDATE async_job_tries AS t
    SET outcome = 'completed', error = NULL, finished_at = now()
    FROM done
    WHERE t.job_id = done.job_id AND t.try_no = done.tries
){mirrors}
SELECT job_id FROM done
"""


def _with_mirrors(template: str, jobs: str, status: str) -> str:
    """`template` with one more WITH clause per mirrored job type: its target rows follow
    the jobs in `jobs` to `status`."""
    clauses = "".join(
        f", mirror_{i} AS (\n    {mirror.update_sql(status, jobs, job_type)}\n)"
        for i, (job_type, mirror) in enumerate(sorted(registry.mirrored().items()))
    )
    return _statements(template, clauses)


@functools.lru_cache(maxsize=32)
def _statements(template: str, clauses: str) -> str:
    return template.replace("{mirrors}", clauses)


_JOB_COLUMNS = tuple(c.key for c in AsyncJob.__table__.columns)


def _job(values: dict[str, Any]) -> AsyncJob:
    """A claimed job as the handlers read it: a transient `AsyncJob` holding every column.
    Built the way the ORM builds the rows it loads (an instance without `__init__`, its
    values set in its `__dict__`), not through the constructor, whose attribute events
    cost ~4–5 % of a drained job's worker CPU; nothing adds it to a session."""
    job: AsyncJob = _new_job()()
    job.__dict__.update(values)
    return job


@functools.cache
def _new_job() -> Callable[[], Any]:
    # The constructor's first call configures the mappers; `new_instance` does not, and
    # an attribute of an unconfigured mapper cannot be read. A fresh worker process may
    # claim before anything else touched the ORM.
    configure_mappers()
    return manager_of_class(AsyncJob).new_instance


@dataclass(frozen=True)
class Claimed:
    """A new try of a job: the job as claimed, and its earlier tries that spent the retry
    budget or were rate-limit waits."""

    job: AsyncJob
    spent: int
    waits: int


async def claim_batch(
    connection: AsyncConnection | asyncpg.Connection,
    job_ids: Sequence[uuid.UUID],
    worker_id: str,
    lease: timedelta,
    *,
    reclaim_own: bool = False,
) -> dict[uuid.UUID, Claimed | JobState | None]:
    """A new try of each job that is claimable, in one statement: PENDING and due →
    PROCESSING, or take over a PROCESSING job whose lease expired (or, with `reclaim_own`,
    that `worker_id` itself holds and knows it no longer runs). `tries` goes up by one: the
    new try's fencing token. The statement is atomic by itself: an autocommit connection
    needs no transaction around it. The worker runs it on the driver (`asyncpg.Connection`,
    `db.engine.driver_connection`); a caller inside a session's transaction passes its
    SQLAlchemy connection.

    For each job id: its `Claimed`, else its state (why not: done, held under a live lease,
    waiting for its next try), else None (unknown job)."""
    statement = _with_mirrors(_CLAIM_BATCH, "claimed", _PROCESSING)
    params = (list(job_ids), worker_id, lease.total_seconds(), reclaim_own)
    rows: Sequence[Mapping[Any, Any]]
    if isinstance(connection, AsyncConnection):
        rows = (await connection.exec_driver_sql(statement, params)).mappings().all()
    else:
        rows = await connection.fetch(statement, *params)
    found: dict[uuid.UUID, Claimed | JobState | None] = {}
    for row in rows:
        if row["job_id"] is not None:
            values = {key: row[key] for key in _JOB_COLUMNS}
            if isinstance(values["checkpoint"], str):  # jsonb, as the driver hands it over
                values["checkpoint"] = json.loads(values["checkpoint"])
            found[row["asked_id"]] = Claimed(_job(values), row["spent_"], row["waits_"])
        elif row["state_status"] is not None:
            found[row["asked_id"]] = JobState(
                row["state_status"],
                row["state_lease_expires_at"],
                row["state_next_attempt_at"],
                row["now_"],
            )
        else:
            found[row["asked_id"]] = None
    return found


async def claim(
    session: AsyncSession,
    job_id: uuid.UUID,
    worker_id: str,
    lease: timedelta,
    *,
    reclaim_own: bool = False,
) -> AsyncJob | None:
    """`claim_batch` for one job: the job as claimed, None when it is not claimable."""
    connection = await session.connection()
    got = await claim_batch(connection, [job_id], worker_id, lease, reclaim_own=reclaim_own)
    claimed = got[job_id]
    return claimed.job if isinstance(claimed, Claimed) else None


async def spent_tries(session: AsyncSession, job_id: uuid.UUID) -> int:
    """Tries that count against the retry budget (see `SPENT_OUTCOMES`)."""
    count = await session.scalar(
        select(func.count())
        .select_from(AsyncJobTry)
        .where(AsyncJobTry.job_id == job_id, AsyncJobTry.outcome.in_(SPENT_OUTCOMES))
    )
    return int(count or 0)


_EXTEND_LEASES = """
UPDATE async_jobs AS j
SET lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
FROM unnest($1::uuid[], $2::integer[]) AS mine(job_id, try_no)
WHERE j.job_id = mine.job_id AND j.status = 'PROCESSING' AND j.tries = mine.try_no
RETURNING j.job_id
"""


async def extend_leases(
    connection: AsyncConnection, tries: Sequence[tuple[uuid.UUID, int]], lease: timedelta
) -> set[uuid.UUID]:
    """A new lease for each (job, try) whose try still holds the job, in one statement;
    returns those job ids (the worker's heartbeat, for every job it runs at once)."""
    if not tries:
        return set()
    rows = await connection.exec_driver_sql(
        _EXTEND_LEASES,
        ([job_id for job_id, _ in tries], [no for _, no in tries], lease.total_seconds()),
    )
    return {job_id for (job_id,) in rows}


async def extend_lease(
    session: AsyncSession, job_id: uuid.UUID, try_no: int, lease: timedelta
) -> bool:
    return job_id in await extend_leases(await session.connection(), [(job_id, try_no)], lease)


async def complete_batch(
    session: AsyncSession, tries: Sequence[tuple[uuid.UUID, int]]
) -> set[uuid.UUID]:
    """PROCESSING → COMPLETED for each (job, try) whose try still holds the job, with its
    try row and its target row's mirrored status; returns those job ids (the others were
    taken over: their try changed nothing)."""
    if not tries:
        return set()
    connection = await session.connection()
    rows = await connection.exec_driver_sql(
        _with_mirrors(_COMPLETE_BATCH, "done", JobStatus.COMPLETED.value),
        ([job_id for job_id, _ in tries], [no for _, no in tries]),
    )
    return {job_id for (job_id,) in rows}


async def complete(session: AsyncSession, job_id: uuid.UUID, try_no: int) -> bool:
    """PROCESSING → COMPLETED, only while try `try_no` still holds the job."""
    return job_id in await complete_batch(session, [(job_id, try_no)])


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
