"""The job lifecycle: the only code that changes `async_jobs.status` or writes
`async_job_tries` (docs/architecture.md, "Job lifecycle").

`TRANSITIONS` declares every status change; below it, one function per event. Each
transition, in the caller's transaction:

- is fenced: a worker's write matches `status = 'PROCESSING' AND tries = <its try>`, so a
  worker whose try was taken over (its lease expired and someone else claimed or rescued
  the job) changes nothing and learns it from the result; the other events match the
  status their caller saw;
- closes the try row it ends with its outcome (a claim opens one);
- moves the mirrored status of the job's target row (the registry's `Mirror`);
- is logged in `async_job_events` by the database (migration 0009's triggers).

The database refuses a status change the table does not declare: migration 0010 holds
the same rows in `async_job_transitions`, and its trigger checks every UPDATE of
`async_jobs` against them (`tests/worker/test_lifecycle.py` keeps the two equal).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from san_common.compat import new_orm_instance
from san_common.errors import MAX_ERROR_MESSAGE
from san_common.jobs import outbox, registry
from san_common.jobs.types import JobStatus
from san_common.models import AsyncJob

_PENDING, _PROCESSING = JobStatus.PENDING.value, JobStatus.PROCESSING.value
_COMPLETED, _FAILED = JobStatus.COMPLETED.value, JobStatus.FAILED.value
_CANCELLED = JobStatus.CANCELLED.value


class Event(StrEnum):
    CLAIM = "claim"  # a worker's new try
    TAKE_OVER = "take_over"  # a claim of a job whose lease ran out (or its own, after an outage)
    COMPLETE = "complete"
    FAIL = "fail"  # a permanent error, or out of tries
    RETRY_LATER = "retry_later"  # a transient failure: the next try is scheduled
    RELEASE = "release"  # given back on shutdown or an outage; no try spent
    RESCUE = "rescue"  # the lease expired: the rescuer makes it claimable again
    REVIVE = "revive"  # recovery: a ghost claimable again under its own id
    GIVE_UP = "give_up"  # recovery: a ghost, or a failed chain, that is not run again
    RETRY = "retry"  # an operator's retry of a FAILED job no newer job superseded
    CANCEL = "cancel"  # an owner's or an operator's cancel of a job not running
    CANCEL_RUNNING = "cancel_running"  # the same, of a running job: its worker is told


@dataclass(frozen=True)
class Transition:
    from_status: JobStatus
    event: Event
    to_status: JobStatus


def _t(from_status: JobStatus, event: Event, to_status: JobStatus) -> Transition:
    return Transition(from_status, event, to_status)


_P, _R = JobStatus.PENDING, JobStatus.PROCESSING
_C, _F, _X = JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED

# Every status change there is. COMPLETED and CANCELLED are final; FAILED is final unless
# an operator retries the job. Rows that keep the status (a takeover, a revived PENDING
# ghost, giving up on a failed chain) are events all the same: they close a try or
# change the job, so they are listed, though the database has no status change to check.
TRANSITIONS: tuple[Transition, ...] = (
    _t(_P, Event.CLAIM, _R),
    _t(_R, Event.TAKE_OVER, _R),
    _t(_R, Event.COMPLETE, _C),
    _t(_R, Event.FAIL, _F),
    _t(_R, Event.RETRY_LATER, _P),
    _t(_R, Event.RELEASE, _P),
    _t(_R, Event.RESCUE, _P),
    _t(_P, Event.REVIVE, _P),
    _t(_R, Event.REVIVE, _P),
    _t(_P, Event.GIVE_UP, _F),
    _t(_R, Event.GIVE_UP, _F),
    _t(_F, Event.GIVE_UP, _F),
    _t(_F, Event.RETRY, _P),
    _t(_P, Event.CANCEL, _X),
    _t(_R, Event.CANCEL_RUNNING, _X),
)


def allowed_changes() -> set[tuple[str, str]]:
    """The (from, to) status pairs the database lets an UPDATE make."""
    return {(t.from_status.value, t.to_status.value) for t in TRANSITIONS}


class TryOutcome(StrEnum):
    """How a try ended (`async_job_tries.outcome`)."""

    COMPLETED = "completed"
    FAILED = "failed"
    RETRY = "retry"  # a transient failure; the next try is scheduled
    RATE_LIMITED = "rate_limited"  # the remote side asked us to wait; no try spent
    LEASE_LOST = "lease_lost"  # the worker stopped renewing its lease; taken over
    RELEASED = "released"  # given back on shutdown or a database outage; no try spent
    TIMED_OUT = "timed_out"  # the job type's timeout cancelled the handler; spends a try
    CANCELLED = "cancelled"  # its job was cancelled while it ran; the worker is told


# Tries that count against a job's retry budget. A lost lease counts: a job that keeps
# killing its worker must end, not loop.
SPENT_OUTCOMES = (
    TryOutcome.RETRY.value,
    TryOutcome.LEASE_LOST.value,
    TryOutcome.TIMED_OUT.value,
)


@dataclass(frozen=True)
class JobState:
    """What a worker that could not claim a job needs to know to decide what to do."""

    status: str
    lease_expires_at: datetime | None
    next_attempt_at: datetime | None
    now: datetime


# -- the SQL ----------------------------------------------------------------------------------
#
# Each event is one statement: the job, its try row and (`{mirrors}`, filled from the
# registry by `_with_mirrors`) the mirrored status of its target row, in one round trip.
# The hot path's claim and completion take a whole batch of jobs at once (the ORM's
# UPDATE machinery cost more CPU per job than the database did: docs/hot-paths.md).

# The fencing condition of every write of a try: this try, and only while it holds the job.
_HELD = "j.job_id = $1 AND j.status = 'PROCESSING' AND j.tries = $2"

_CLAIM_BATCH = """
WITH asked AS (
    SELECT DISTINCT unnest($1::uuid[]) AS job_id
), claimed AS (
    UPDATE async_jobs AS j
    SET status = 'PROCESSING', tries = j.tries + 1, worker_id = $2,
        lease_expires_at = now() + make_interval(secs => $3),
        next_attempt_at = NULL, waiting_for = NULL, waiting_key = NULL,
        started_at = now(), updated_at = now()
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
            WHERE t.job_id = claimed.job_id AND t.outcome IN ('retry', 'lease_lost', 'timed_out'))
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

_EXTEND_LEASES = """
UPDATE async_jobs AS j
SET lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
FROM unnest($1::uuid[], $2::integer[]) AS mine(job_id, try_no)
WHERE j.job_id = mine.job_id AND j.status = 'PROCESSING' AND j.tries = mine.try_no
RETURNING j.job_id
"""

# $1 job, $2 try, $3 the error, $4 the owner's summary
_FAIL = f"""
WITH failed AS (
    UPDATE async_jobs AS j
    SET status = 'FAILED', error_message = $3, last_error = $3, error_summary = $4,
        finished_at = now(), updated_at = now(), lease_expires_at = NULL
    WHERE {_HELD}
    RETURNING j.job_id, j.tries, j.job_type, j.target_id
), ended AS (
    UPDATE async_job_tries AS t
    SET outcome = 'failed', error = $3, finished_at = now()
    FROM failed
    WHERE t.job_id = failed.job_id AND t.try_no = failed.tries
)
SELECT job_type, target_id FROM failed
"""

# $1 job, $2 try, $3 delay (s), $4 the error, $5 the summary, $6 the try's outcome,
# $7 a checkpoint for the next try (NULL: keep the one there is), $8 what the job waits
# for (NULL: a retry), $9 which upstream quota
_RETRY_LATER = f"""
WITH retried AS (
    UPDATE async_jobs AS j
    SET status = 'PENDING', worker_id = NULL, lease_expires_at = NULL,
        next_attempt_at = now() + make_interval(secs => $3), last_error = $4,
        error_summary = $5, checkpoint = coalesce($7::jsonb, j.checkpoint),
        waiting_for = $8, waiting_key = $9, updated_at = now()
    WHERE {_HELD}
    RETURNING j.job_id, j.tries, j.job_type, j.target_id, j.user_id, j.attempt,
        j.next_attempt_at
), ended AS (
    UPDATE async_job_tries AS t
    SET outcome = $6, error = $4, finished_at = now()
    FROM retried
    WHERE t.job_id = retried.job_id AND t.try_no = retried.tries
){{mirrors}}
SELECT * FROM retried
"""

# $1 job, $2 try, $3 why
_RELEASE = f"""
WITH released AS (
    UPDATE async_jobs AS j
    SET status = 'PENDING', worker_id = NULL, lease_expires_at = NULL, started_at = NULL,
        updated_at = now()
    WHERE {_HELD}
    RETURNING j.job_id, j.tries, j.job_type, j.target_id
), ended AS (
    UPDATE async_job_tries AS t
    SET outcome = 'released', error = $3, finished_at = now()
    FROM released
    WHERE t.job_id = released.job_id AND t.try_no = released.tries
){{mirrors}}
SELECT job_id FROM released
"""

# $1 how many. `SKIP LOCKED` keeps several rescuers and a worker settling the job at the
# same moment from colliding. `spent` counts the lost try too: it is still open here (one
# snapshot for the whole statement).
_RESCUE = """
WITH expired AS (
    SELECT job_id, worker_id FROM async_jobs
    WHERE status = 'PROCESSING' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE async_jobs AS j
    SET status = 'PENDING', worker_id = NULL, lease_expires_at = NULL, started_at = NULL,
        last_error = 'lease expired (worker ' || coalesce(expired.worker_id, '?') || ')',
        updated_at = now()
    FROM expired
    WHERE j.job_id = expired.job_id
    RETURNING j.job_id, j.job_type, j.target_id, j.user_id, j.attempt, expired.worker_id
), ended AS (
    UPDATE async_job_tries AS t
    SET outcome = 'lease_lost', error = 'lease expired', finished_at = now()
    FROM rescued
    WHERE t.job_id = rescued.job_id AND t.outcome IS NULL
){mirrors}
SELECT rescued.*,
    (SELECT count(*) FROM async_job_tries AS t
        WHERE t.job_id = rescued.job_id
          AND (t.outcome IN ('retry', 'lease_lost', 'timed_out') OR t.outcome IS NULL)) AS spent
FROM rescued
"""

# $1 job, $2 the status recovery saw, $3 why (the lost try's error too), $4 summary
_REVIVE = """
WITH revived AS (
    UPDATE async_jobs AS j
    SET status = 'PENDING', worker_id = NULL, lease_expires_at = NULL, started_at = NULL,
        finished_at = NULL, next_attempt_at = NULL, attempt = j.attempt + 1,
        last_error = $3, error_summary = $4, updated_at = now()
    WHERE j.job_id = $1 AND j.status = $2 AND j.status IN ('PENDING', 'PROCESSING')
    RETURNING j.job_id, j.job_type, j.target_id, j.user_id, j.attempt
), ended AS (
    UPDATE async_job_tries AS t
    SET outcome = 'lease_lost', error = $3, finished_at = now()
    FROM revived
    WHERE t.job_id = revived.job_id AND t.outcome IS NULL
){mirrors}
SELECT * FROM revived
"""

# $1 job, $2 the status recovery saw, $3 why. A FAILED job keeps its end time.
_GIVE_UP = """
WITH failed AS (
    UPDATE async_jobs AS j
    SET status = 'FAILED', error_message = $3, lease_expires_at = NULL,
        next_attempt_at = NULL, updated_at = now(),
        finished_at = CASE WHEN j.status = 'FAILED' THEN j.finished_at ELSE now() END
    WHERE j.job_id = $1 AND j.status = $2
    RETURNING j.job_id, j.job_type, j.target_id
), ended AS (
    UPDATE async_job_tries AS t
    SET outcome = 'lease_lost', error = $3, finished_at = now()
    FROM failed
    WHERE t.job_id = failed.job_id AND t.outcome IS NULL
)
SELECT job_type, target_id FROM failed
"""

# A job of a (target, type) created after `j`: whatever became of it, it took `j`'s place.
_NEWER = """EXISTS (
        SELECT 1 FROM async_jobs AS newer
        WHERE newer.target_id = j.target_id AND newer.job_type = j.job_type
          AND (newer.created_at, newer.job_id) > (j.created_at, j.job_id)
    )"""

# Retry and follow-up lock the FAILED jobs first, in a statement of their own, so the
# statement that checks for a newer job runs on a snapshot taken after the lock: whoever
# held it (the failed sweep registering a follow-up, another operator) has committed, and
# its job is seen (READ COMMITTED takes a snapshot per statement).
_LOCK = "SELECT job_id FROM async_jobs WHERE job_id = ANY($1::uuid[]) ORDER BY job_id FOR UPDATE"

_RETRY = f"""
WITH retried AS (
    UPDATE async_jobs AS j
    SET status = 'PENDING', worker_id = NULL, lease_expires_at = NULL, started_at = NULL,
        finished_at = NULL, next_attempt_at = NULL, updated_at = now()
    WHERE j.job_id = ANY($1::uuid[]) AND j.status = 'FAILED'
      AND NOT {_NEWER}
    RETURNING j.job_id, j.job_type, j.target_id, j.user_id, j.attempt
){{mirrors}}
SELECT * FROM retried
"""

_FOLLOWABLE = f"""
SELECT j.job_id FROM async_jobs AS j
WHERE j.job_id = $1 AND j.status = 'FAILED' AND NOT {_NEWER}
"""

_SUPERSEDED = f"""
SELECT j.job_id FROM async_jobs AS j
WHERE j.job_id = ANY($1::uuid[]) AND j.status = 'FAILED' AND {_NEWER}
"""

_SUPERSEDED_SINCE = f"""
SELECT count(*) FROM async_jobs AS j
WHERE j.status = 'FAILED' AND j.updated_at >= $1 AND {_NEWER}
"""

# The channel a running job's cancel is announced on (payload: the job id). Every worker
# LISTENs to it (`san_common.worker.cancels`); the one running the job stops its handler.
CANCEL_CHANNEL = "san_job_cancel"

# $1 jobs, $2 why, $3 the job types that may be cancelled while PROCESSING. A PENDING job
# has no open try (every way out of PROCESSING closes it); a PROCESSING one's open try ends
# `cancelled`, so the worker's later writes are fenced out (the job is no longer
# PROCESSING), and its worker is told in the same transaction: the NOTIFY is delivered on
# commit, never for a cancel rolled back.
_CANCEL = f"""
WITH seen AS (
    SELECT j.job_id, j.status AS was FROM async_jobs AS j
    WHERE j.job_id = ANY($1::uuid[])
      AND (j.status = 'PENDING' OR (j.status = 'PROCESSING' AND j.job_type = ANY($3::text[])))
    ORDER BY j.job_id
    FOR UPDATE
), cancelled AS (
    UPDATE async_jobs AS j
    SET status = 'CANCELLED', error_message = $2, finished_at = now(), updated_at = now(),
        worker_id = NULL, lease_expires_at = NULL, next_attempt_at = NULL
    FROM seen
    WHERE j.job_id = seen.job_id AND j.status = seen.was
    RETURNING j.job_id, j.job_type, j.target_id, j.tries, seen.was
), ended AS (
    UPDATE async_job_tries AS t
    SET outcome = 'cancelled', error = $2, finished_at = now()
    FROM cancelled
    WHERE t.job_id = cancelled.job_id AND t.try_no = cancelled.tries AND t.outcome IS NULL
      AND cancelled.was = 'PROCESSING'
)
SELECT job_id, job_type, target_id,
    CASE WHEN was = 'PROCESSING' THEN pg_notify('{CANCEL_CHANNEL}', job_id::text) END
FROM cancelled
"""


def _with_mirrors(template: str, jobs: str, status: str) -> str:
    """`template` with one more WITH clause per mirrored job type: its target rows follow
    the jobs in `jobs` to `status`. Built once per registry state: writing the clauses out
    cost each claim and each completion batch tens of microseconds, as much as a one-job
    batch's own Python work on a small machine (docs/hot-paths.md)."""
    return _statement(template, jobs, status, tuple(sorted(registry.mirrored().items())))


@functools.lru_cache(maxsize=64)
def _statement(
    template: str, jobs: str, status: str, mirrors: tuple[tuple[str, registry.Mirror], ...]
) -> str:
    clauses = "".join(
        f", mirror_{i} AS (\n    {mirror.update_sql(status, jobs, job_type)}\n)"
        for i, (job_type, mirror) in enumerate(mirrors)
    )
    return template.replace("{mirrors}", clauses)


async def _run(session: AsyncSession, statement: str, *params: object) -> Sequence[Any]:
    connection = await session.connection()
    return (await connection.exec_driver_sql(statement, params)).all()


async def _mirror_error(
    session: AsyncSession, job_type: str, target_id: uuid.UUID, status: str, error: str
) -> None:
    """The mirrored status with the error beside it (FAILED): a statement of its own, off
    the hot path."""
    spec = registry.find(job_type)
    if spec is not None and spec.mirror is not None:
        await spec.mirror.set(session, target_id, status, error)


# -- the worker's events ----------------------------------------------------------------------

_JOB_COLUMNS = tuple(c.key for c in AsyncJob.__table__.columns)


def _job(values: dict[str, Any]) -> AsyncJob:
    """A claimed job as the handlers read it: a transient `AsyncJob` holding every column,
    built without the constructor's attribute events (`compat.new_orm_instance`)."""
    return new_orm_instance(AsyncJob, values)


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
    """CLAIM or TAKE_OVER: a new try of each job that is claimable, in one statement:
    PENDING and due → PROCESSING, or take over a PROCESSING job whose lease expired (or,
    with `reclaim_own`, that `worker_id` itself holds and knows it no longer runs). `tries`
    goes up by one: the new try's fencing token. The statement is atomic by itself: an
    autocommit connection needs no transaction around it. The worker runs it on the driver
    (`asyncpg.Connection`, `db.engine.driver_connection`); a caller inside a session's
    transaction passes its SQLAlchemy connection.

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


async def extend_leases(
    connection: AsyncConnection, tries: Sequence[tuple[uuid.UUID, int]], lease: timedelta
) -> set[uuid.UUID]:
    """A new lease for each (job, try) whose try still holds the job, in one statement;
    returns those job ids (the worker's heartbeat, for every job it runs at once). Not a
    transition: the status stays PROCESSING."""
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
    session: AsyncSession | asyncpg.Connection, tries: Sequence[tuple[uuid.UUID, int]]
) -> set[uuid.UUID]:
    """COMPLETE: PROCESSING → COMPLETED for each (job, try) whose try still holds the job,
    with its try row and its target row's mirrored status; returns those job ids (the
    others were taken over: their try changed nothing). In the caller's transaction: a
    session's, or one the worker holds open on the driver (`asyncpg.Connection`, when its
    handlers' writes are single statements: worker/store.py)."""
    if not tries:
        return set()
    statement = _with_mirrors(_COMPLETE_BATCH, "done", _COMPLETED)
    params = ([job_id for job_id, _ in tries], [no for _, no in tries])
    if not isinstance(session, AsyncSession):
        return {row[0] for row in await session.fetch(statement, *params)}
    connection = await session.connection()
    rows = await connection.exec_driver_sql(statement, params)
    return {job_id for (job_id,) in rows}


async def complete(session: AsyncSession, job_id: uuid.UUID, try_no: int) -> bool:
    """COMPLETE for one job, only while try `try_no` still holds it."""
    return job_id in await complete_batch(session, [(job_id, try_no)])


async def fail(
    session: AsyncSession, job_id: uuid.UUID, try_no: int, message: str, summary: str
) -> bool:
    """FAIL: PROCESSING → FAILED with the cause chain (`message`, for operators), only
    while try `try_no` holds the job; its target row's mirror FAILED with `summary`: the
    row is its owner's to read, so it gets the sanitized summary, never the chain."""
    message = message[:MAX_ERROR_MESSAGE]
    rows = await _run(session, _FAIL, job_id, try_no, message, summary)
    for job_type, target_id in rows:
        await _mirror_error(session, job_type, target_id, _FAILED, summary)
    return bool(rows)


async def retry_later(
    session: AsyncSession,
    job_id: uuid.UUID,
    try_no: int,
    *,
    delay: timedelta,
    error: str,
    summary: str,
    outcome: TryOutcome = TryOutcome.RETRY,
    checkpoint: dict[str, object] | None = None,
    waiting_for: str | None = None,
    waiting_key: str | None = None,
) -> datetime | None:
    """RETRY_LATER: end try `try_no` with a transient failure (`outcome`: retry, or a
    rate-limit wait that spends no try). The job goes back to PENDING with
    `next_attempt_at`, keeping `checkpoint` for the next try when given, and its next
    message is added to the outbox, due at that time — all in the caller's transaction, so
    the job is never waiting without a message. `waiting_for` (`errors.WAITING_FOR`) and
    `waiting_key` say what a wait the system imposed waits for, until the next claim.
    Returns the time of the next try, None when the try no longer holds the job."""
    error = error[:MAX_ERROR_MESSAGE]
    rows = await _run(
        session,
        _with_mirrors(_RETRY_LATER, "retried", _PENDING),
        job_id,
        try_no,
        delay.total_seconds(),
        error,
        summary,
        outcome.value,
        None if checkpoint is None else json.dumps(checkpoint),
        waiting_for,
        waiting_key,
    )
    if not rows:
        return None
    [job] = rows
    await outbox.add_job_message(session, job, available_at=job.next_attempt_at)
    at: datetime = job.next_attempt_at
    return at


async def release(
    session: AsyncSession, job_id: uuid.UUID, try_no: int, reason: str = "released"
) -> bool:
    """RELEASE: PROCESSING → PENDING without spending a try (shutdown, database outage).
    The caller requeues the job's message, so no outbox row is added."""
    rows = await _run(
        session, _with_mirrors(_RELEASE, "released", _PENDING), job_id, try_no, reason
    )
    return bool(rows)


async def schedule_message(session: AsyncSession, job_id: uuid.UUID, at: datetime) -> bool:
    """A new message for an active job, due at `at` (a delivery that arrived while another
    worker held the job comes back when that worker's lease runs out). Not a transition."""
    job = await session.get(AsyncJob, job_id)
    if job is None or job.status not in (_PENDING, _PROCESSING):
        return False
    await outbox.add_job_message(session, job, available_at=at)
    return True


# -- maintenance: the rescuer and recovery ----------------------------------------------------


@dataclass(frozen=True)
class Rescued:
    job_id: uuid.UUID
    job_type: str
    target_id: uuid.UUID
    worker_id: str | None
    spent: int


async def rescue_expired(session: AsyncSession, *, limit: int) -> list[Rescued]:
    """RESCUE: PROCESSING jobs whose lease expired → PENDING under the same job id, each
    with a new outbox message and its target row's mirror PENDING. The lost try ends
    `lease_lost`; the next claim increments `tries`, so whatever the lost worker writes
    later is fenced out. Returns what was rescued with the tries each job has spent."""
    rows = await _run(session, _with_mirrors(_RESCUE, "rescued", _PENDING), limit)
    for job in rows:
        await outbox.add_job_message(session, job)
    return [Rescued(r.job_id, r.job_type, r.target_id, r.worker_id, r.spent) for r in rows]


async def revive(
    session: AsyncSession, job_id: uuid.UUID, *, from_status: str, reason: str
) -> bool:
    """REVIVE: a ghost (PENDING whose message was lost, PROCESSING whose worker died or
    hangs) claimable again under its own job id — its clients poll that id — with
    `attempt` + 1 (the retry cap's count), `reason` as its last error and a new outbox
    message. An open try ends `lease_lost` and is fenced out. Only while the job is still
    in `from_status`, the status recovery saw."""
    rows = await _run(
        session,
        _with_mirrors(_REVIVE, "revived", _PENDING),
        job_id,
        from_status,
        reason[:MAX_ERROR_MESSAGE],
        "restarted: its worker was lost or its message never arrived",
    )
    for job in rows:
        await outbox.add_job_message(session, job)
    return bool(rows)


async def give_up(
    session: AsyncSession,
    job_id: uuid.UUID,
    *,
    from_status: str,
    message: str,
    owner_message: str,
) -> bool:
    """GIVE_UP: recovery stops retrying. A ghost (PENDING or PROCESSING) ends FAILED with
    its open try `lease_lost`; a FAILED job gets `message` (the failed sweep then leaves
    it). Its target row's mirror ends FAILED, never stuck PROCESSING, with `owner_message`
    (its owner reads that row: sanitized, no cause chain). Only while the job is still in
    `from_status`."""
    message = message[:MAX_ERROR_MESSAGE]
    rows = await _run(session, _GIVE_UP, job_id, from_status, message)
    for job_type, target_id in rows:
        await _mirror_error(session, job_type, target_id, _FAILED, owner_message)
    return bool(rows)


async def follow_up(
    session: AsyncSession, job_id: uuid.UUID, register: Callable[[], Awaitable[object]]
) -> bool:
    """The failed sweep's re-registration of a FAILED job: `register()` (which adds the new
    job) runs only while the job is still FAILED and no newer job of its target and type
    exists, checked under the job's row lock — the rule `retry` checks under the same lock,
    so the sweep and an operator never both produce work for one target. False: superseded
    or no longer FAILED; nothing registered."""
    await _run(session, _LOCK, [job_id])
    if not await _run(session, _FOLLOWABLE, job_id):
        return False
    await register()
    return True


async def mirror_pending(session: AsyncSession, job_type: str, target_id: uuid.UUID) -> None:
    """The target row of a job registered again goes back to PENDING with its new job."""
    spec = registry.find(job_type)
    if spec is not None and spec.mirror is not None:
        await spec.mirror.set(session, target_id, _PENDING)


# -- operators --------------------------------------------------------------------------------


async def retry(session: AsyncSession, job_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """RETRY: FAILED → PENDING under the same job ids, each with a new outbox message and
    its target row's mirror PENDING — except a job that a newer job of its target and type
    superseded (active, completed, or failed in turn: retry that one instead). Returns the
    ids retried. Raises IntegrityError (the partial unique index) when a job for the same
    target was registered at the same moment: run it in a savepoint."""
    if not job_ids:
        return []
    await _run(session, _LOCK, list(job_ids))
    rows = await _run(session, _with_mirrors(_RETRY, "retried", _PENDING), list(job_ids))
    for job in rows:
        await outbox.add_job_message(session, job)
    return [job.job_id for job in rows]


async def superseded(session: AsyncSession, job_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """The FAILED jobs among `job_ids` that a newer job of their target and type took the
    place of: `retry` leaves them."""
    if not job_ids:
        return set()
    return {job_id for (job_id,) in await _run(session, _SUPERSEDED, list(job_ids))}


async def count_superseded(session: AsyncSession, *, since: datetime) -> int:
    """FAILED jobs changed since `since` that a newer job superseded (the console shows
    them apart from the failures nobody has dealt with)."""
    [(count,)] = await _run(session, _SUPERSEDED_SINCE, since)
    return int(count)


async def cancel(
    session: AsyncSession,
    job_ids: Sequence[uuid.UUID],
    reason: str,
    owner_message: str = "cancelled by an operator",
) -> int:
    """CANCEL: PENDING (including waiting for a retry) → CANCELLED, terminal; a worker
    never claims it. CANCEL_RUNNING: PROCESSING → CANCELLED for a job type that may be
    cancelled while it runs (`JobSpec.cancellable_while_running`): its open try ends
    `cancelled` and its worker is told on `CANCEL_CHANNEL` to stop the handler. `reason` is
    kept for operators. Its target row's mirror ends FAILED with `owner_message`, what the
    row's owner may read. Returns how many."""
    if not job_ids:
        return 0
    rows = await _run(
        session,
        _CANCEL,
        list(job_ids),
        reason[:MAX_ERROR_MESSAGE],
        registry.cancellable_while_running(),
    )
    for _, job_type, target_id, _ in rows:
        await _mirror_error(session, job_type, target_id, _FAILED, owner_message)
    return len(rows)
