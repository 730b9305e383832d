"""Queries of the recovery sweeps. Nothing here commits; the runner owns the transaction."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from enum import StrEnum

from sqlalchemy import (
    ColumnElement,
    Executable,
    and_,
    delete,
    exists,
    false,
    func,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from san_common.errors import MAX_ERROR_MESSAGE
from san_common.jobs import registry
from san_common.jobs.types import JobStatus, JobType
from san_common.models import (
    AsyncJob,
    GithubOAuthState,
    OutboxMessage,
    RateLimitBucket,
    Scrap,
    SweepRequest,
    SweepRun,
)

# Every message recovery writes when it stops retrying starts with this, so the failed
# sweep can tell a settled failure from one it still has to look at. Worker messages start
# with "<JOB_TYPE> failed:" and ghost messages with "ghost job:", so nothing else matches.
GAVE_UP_PREFIX = "recovery gave up"

_PENDING, _PROCESSING = JobStatus.PENDING.value, JobStatus.PROCESSING.value
_FAILED, _COMPLETED = JobStatus.FAILED.value, JobStatus.COMPLETED.value


async def try_sweep_lock(session: AsyncSession, sweep: str) -> bool:
    """Transaction-scoped advisory lock per sweep: one run of a sweep at a time, across
    replicas. Taken before any candidate query, so (READ COMMITTED) the holder sees what
    the previous holder committed."""
    locked = await session.scalar(
        text("SELECT pg_try_advisory_xact_lock(hashtextextended(:key, 0))"),
        {"key": f"san.recovery:{sweep}"},
    )
    return bool(locked)


# -- jobs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    """A candidate job as the sweep saw it (plain data: no ORM state to go stale)."""

    job_id: uuid.UUID
    job_type: str
    target_id: uuid.UUID
    user_id: uuid.UUID
    status: str
    attempt: int
    error_message: str | None
    updated_at: datetime
    started_at: datetime | None
    lease_expires_at: datetime | None
    worker_id: str | None
    error_summary: str | None  # the sanitized one its owner sees (san_common.errors.summarize)


_JOB_COLUMNS = (
    AsyncJob.job_id,
    AsyncJob.job_type,
    AsyncJob.target_id,
    AsyncJob.user_id,
    AsyncJob.status,
    AsyncJob.attempt,
    AsyncJob.error_message,
    AsyncJob.updated_at,
    AsyncJob.started_at,
    AsyncJob.lease_expires_at,
    AsyncJob.worker_id,
    AsyncJob.error_summary,
)


async def _job_rows(session: AsyncSession, query: Executable) -> list[JobRow]:
    rows = await session.execute(query)
    return [JobRow(*row) for row in rows]


async def ghost_candidates(
    session: AsyncSession,
    *,
    pending_before: datetime,
    started_before: datetime,
    lease_expired_before: datetime,
    limit: int,
) -> list[JobRow]:
    """PENDING jobs untouched since `pending_before` (a job waiting for its next try counts
    from that try's time, not from when it was scheduled), PROCESSING jobs started before
    `started_before` or whose lease ran out before `lease_expired_before`; locked, and
    rows another transaction holds (a worker settling the job, another sweep) skipped."""
    pending = and_(
        AsyncJob.status == _PENDING,
        func.greatest(AsyncJob.updated_at, AsyncJob.next_attempt_at) < pending_before,
    )
    processing = and_(
        AsyncJob.status == _PROCESSING,
        or_(
            func.coalesce(AsyncJob.started_at, AsyncJob.updated_at) < started_before,
            AsyncJob.lease_expires_at < lease_expired_before,
        ),
    )
    return await _job_rows(
        session,
        select(*_JOB_COLUMNS)
        .where(or_(pending, processing))
        .order_by(AsyncJob.target_id, AsyncJob.job_type)
        .limit(limit)
        .with_for_update(of=AsyncJob, skip_locked=True),
    )


async def failed_candidates(session: AsyncSession, *, limit: int) -> list[JobRow]:
    """FAILED jobs that are the newest job of their (target, type) and that recovery has
    not given up on yet; locked, skipping rows another transaction holds."""
    newer = aliased(AsyncJob)
    return await _job_rows(
        session,
        select(*_JOB_COLUMNS)
        .where(
            AsyncJob.status == _FAILED,
            or_(
                AsyncJob.error_message.is_(None),
                ~AsyncJob.error_message.startswith(GAVE_UP_PREFIX, autoescape=True),
            ),
            ~exists().where(
                newer.target_id == AsyncJob.target_id,
                newer.job_type == AsyncJob.job_type,
                tuple_(newer.created_at, newer.job_id)
                > tuple_(AsyncJob.created_at, AsyncJob.job_id),
            ),
        )
        .order_by(AsyncJob.target_id, AsyncJob.job_type)
        .limit(limit)
        .with_for_update(of=AsyncJob, skip_locked=True),
    )


# -- targets ----------------------------------------------------------------------------------


class TargetState(StrEnum):
    OPEN = "open"  # worth another attempt
    MISSING = "missing"  # the target row is gone
    DONE = "done"  # the work the job stands for is already there
    SUPERSEDED = "superseded"  # another target took its place (a newer commit of the content)


async def target_state(session: AsyncSession, job_type: str, target_id: uuid.UUID) -> TargetState:
    spec = registry.find(job_type)
    if spec is None:
        return TargetState.MISSING  # a job type no longer served: nothing to re-run
    superseded = false() if spec.superseded is None else spec.superseded(target_id)
    exists_, done, replaced = (
        await session.execute(
            select(spec.target_exists(target_id), spec.already_done(target_id), superseded)
        )
    ).one()
    if not exists_:
        return TargetState.MISSING
    if done:
        return TargetState.DONE
    return TargetState.SUPERSEDED if replaced else TargetState.OPEN


# -- scraps -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScrapCandidate:
    scrap_id: uuid.UUID
    user_id: uuid.UUID
    attempt: int


async def scraps_missing(
    session: AsyncSession,
    job_type: JobType,
    *,
    created_before: datetime,
    max_attempt: int,
    limit: int,
) -> list[ScrapCandidate]:
    """Scraps older than the grace period without the result of `job_type` (a knowledge
    card, refined content) whose newest `job_type` job is absent, or COMPLETED with
    attempts left. Active jobs belong to the ghost sweep, FAILED ones to the failed sweep
    (which also enforces the retry cap), so no scrap is handled by two sweeps.

    `FOR KEY SHARE … SKIP LOCKED`: scraps being deleted are skipped, while workers storing
    refined content (a non-key update) are not blocked."""
    spec = registry.spec_for(job_type)
    if spec.target is not Scrap.__table__:
        raise ValueError(f"{job_type} does not target scraps")
    missing = ~spec.already_done(Scrap.id)
    latest = (
        select(AsyncJob.status, AsyncJob.attempt)
        .where(AsyncJob.target_id == Scrap.id, AsyncJob.job_type == job_type.value)
        .order_by(AsyncJob.created_at.desc(), AsyncJob.job_id.desc())
        .limit(1)
        .lateral("latest")
    )
    rows = await session.execute(
        select(Scrap.id, Scrap.user_id, latest.c.attempt)
        .outerjoin(latest, text("true"))
        .where(
            Scrap.created_at < created_before,
            missing,
            or_(
                latest.c.status.is_(None),
                and_(latest.c.status == _COMPLETED, latest.c.attempt < max_attempt),
            ),
        )
        .order_by(Scrap.id)
        .limit(limit)
        .with_for_update(of=Scrap, key_share=True, skip_locked=True)
    )
    return [
        ScrapCandidate(scrap_id, user_id, 1 if attempt is None else attempt + 1)
        for scrap_id, user_id, attempt in rows
    ]


# -- the daily TIL batch ----------------------------------------------------------------------


@dataclass(frozen=True)
class UserDay:
    user_id: uuid.UUID
    day: date
    needs_til: bool
    needs_quiz: bool


# Each user's days are computed in the user's time zone; a name PostgreSQL does not know
# counts as UTC (as `san_common.til.zone_named` does), so one bad setting cannot fail the batch.
_USER_DAYS = text(
    """
WITH zones AS MATERIALIZED (SELECT name FROM pg_timezone_names),
user_days AS (
    SELECT u.id AS user_id, z.tz,
           (CAST(:now AS timestamptz) AT TIME ZONE z.tz)::date - g.n AS day
    FROM users u
    CROSS JOIN LATERAL (
        SELECT CASE WHEN u.timezone IN (SELECT name FROM zones) THEN u.timezone ELSE 'UTC' END
    ) AS z(tz)
    CROSS JOIN generate_series(1, CAST(:lookback AS integer)) AS g(n)
),
with_cards AS (
    SELECT d.user_id, d.day,
           NOT EXISTS (SELECT 1 FROM daily_summaries s
                       WHERE s.user_id = d.user_id AND s.target_date = d.day) AS needs_til,
           NOT EXISTS (SELECT 1 FROM recall_quiz_generations q
                       WHERE q.user_id = d.user_id AND q.target_date = d.day) AS needs_quiz
    FROM user_days d
    WHERE EXISTS (SELECT 1 FROM knowledge_cards c
                  WHERE c.user_id = d.user_id
                    AND c.created_at >= (d.day::timestamp AT TIME ZONE d.tz)
                    AND c.created_at < ((d.day + 1)::timestamp AT TIME ZONE d.tz))
)
SELECT user_id, day, needs_til, needs_quiz FROM with_cards
WHERE needs_til OR needs_quiz
ORDER BY user_id, day
LIMIT :limit
"""
)


async def user_days_without_til(
    session: AsyncSession, *, now: datetime, lookback_days: int, limit: int
) -> list[UserDay]:
    """(user, day) for each of the last `lookback_days` days before the user's today on
    which the user made cards and has no TIL or no recall-quiz generation yet."""
    rows = await session.execute(
        _USER_DAYS, {"now": now, "lookback": lookback_days, "limit": limit}
    )
    return [UserDay(*row) for row in rows]


# -- retention --------------------------------------------------------------------------------


async def prune_jobs(
    session: AsyncSession, *, status: JobStatus, finished_before: datetime, limit: int
) -> list[tuple[uuid.UUID, str]]:
    """Delete up to `limit` jobs in `status` that finished before the horizon, oldest
    first, skipping rows another transaction holds; (job_id, job_type) of each."""
    # A CTE, evaluated once: as an `IN (subquery … LIMIT)` the planner may re-run the
    # subquery per row and delete more than `limit` rows.
    doomed = (
        select(AsyncJob.job_id)
        .where(AsyncJob.status == status.value, AsyncJob.finished_at < finished_before)
        .order_by(AsyncJob.finished_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("doomed")
    )
    rows = await session.execute(
        delete(AsyncJob)
        .where(AsyncJob.job_id.in_(select(doomed.c.job_id)), AsyncJob.status == status.value)
        .returning(AsyncJob.job_id, AsyncJob.job_type)
    )
    return [(row[0], row[1]) for row in rows]


async def delete_outbox_of(session: AsyncSession, job_ids: list[uuid.UUID]) -> None:
    """Outbox rows of pruned jobs (the relay deletes published rows on its own schedule;
    this catches the rest, e.g. the unpublished message of a cancelled job)."""
    if job_ids:
        await session.execute(
            delete(OutboxMessage).where(
                OutboxMessage.body["job_id"].astext.in_([str(j) for j in job_ids])
            )
        )


# -- sweep history and operators' requests ----------------------------------------------------


async def record_run(
    session: AsyncSession,
    *,
    sweep: str,
    trigger: str,
    status: str,
    started_at: datetime,
    finished_at: datetime,
    batches: int,
    totals: dict[str, int],
    error: str | None,
    request_id: int | None,
) -> None:
    session.add(
        SweepRun(
            sweep=sweep,
            trigger=trigger,
            status=status,
            started_at=started_at,
            finished_at=finished_at,
            batches=batches,
            totals=totals,
            error=error[:MAX_ERROR_MESSAGE] if error else None,
            request_id=request_id,
        )
    )
    await session.flush()


async def claim_request(session: AsyncSession, *, stale_after: timedelta) -> SweepRequest | None:
    """The oldest unfinished "run now" request nobody runs — never taken, or taken by a
    process whose heartbeat stopped `stale_after` ago (it died, or lost the database) —
    marked started, its `attempts` counted. One replica takes each (SKIP LOCKED)."""
    oldest = (
        select(SweepRequest.id)
        .where(
            SweepRequest.finished_at.is_(None),
            or_(
                SweepRequest.started_at.is_(None),
                SweepRequest.heartbeat_at < func.now() - stale_after,
            ),
        )
        .order_by(SweepRequest.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    claimed: SweepRequest | None = await session.scalar(
        update(SweepRequest)
        .where(SweepRequest.id == oldest)
        .values(started_at=func.now(), heartbeat_at=func.now(), attempts=SweepRequest.attempts + 1)
        .returning(SweepRequest)
    )
    return claimed


async def _update_held(
    session: AsyncSession, request_id: int, attempt: int, **values: object
) -> bool:
    """Update the request if it is still the one this taker took (not finished, not
    taken since); whether it was."""
    result = await session.execute(
        update(SweepRequest)
        .where(
            SweepRequest.id == request_id,
            SweepRequest.attempts == attempt,
            SweepRequest.finished_at.is_(None),
        )
        .values(**values)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def beat_request(session: AsyncSession, request_id: int, attempt: int) -> bool:
    """The taker is alive; False when the request was taken again meanwhile."""
    return await _update_held(session, request_id, attempt, heartbeat_at=func.now())


async def finish_request(
    session: AsyncSession, request_id: int, attempt: int, *, ok: bool, error: str | None = None
) -> bool:
    return await _update_held(
        session, request_id, attempt, finished_at=func.now(), ok=ok, error=error
    )


async def give_back_request(session: AsyncSession, request_id: int, attempt: int) -> bool:
    """Unstarted again, for the next process (this one is shutting down mid-run). The
    attempt stays counted: `attempts` is the fencing token, and a token used once is never
    handed out again."""
    return await _update_held(session, request_id, attempt, started_at=None, heartbeat_at=None)


# -- maintenance: stranded messages, outbox cleanup ----------------------------------------


async def try_task_lock(session: AsyncSession, task: str) -> bool:
    """`try_sweep_lock` for a maintenance task (one queue's stranded check, the cleanup)."""
    return await try_sweep_lock(session, f"task:{task}")


async def unpublished_messages(
    session: AsyncSession, job_types: Sequence[str], grace: timedelta
) -> tuple[datetime, int]:
    """The database's clock minus `grace` (the stranded check's cutoff), and how many
    messages of these job types are due by then but still in the outbox: their jobs wait
    for the relay, not for a lost message. A row the API publishes itself (`direct`) counts
    from its creation, as its job waits from then: its due time is only the relay's grace
    (docs/architecture.md, "Direct publish")."""
    cutoff = (await session.execute(select(func.now() - grace))).scalar_one()
    count = await session.scalar(
        select(func.count())
        .select_from(OutboxMessage)
        .where(
            OutboxMessage.published_at.is_(None),
            or_(
                OutboxMessage.available_at < cutoff,
                and_(OutboxMessage.direct, OutboxMessage.created_at < cutoff),
            ),
            OutboxMessage.routing_key.in_(list(job_types)),
        )
    )
    return cutoff, int(count or 0)


# Since when a PENDING job has been waiting for a delivery: it became PENDING (registered,
# retried, rescued, released, re-published: each sets `updated_at`), or its next try fell
# due. Its message was published about then.
_WAITING_SINCE = func.greatest(AsyncJob.updated_at, AsyncJob.next_attempt_at)


def _waiting(job_types: Sequence[str], cutoff: datetime) -> list[ColumnElement[bool]]:
    return [
        AsyncJob.status == _PENDING,
        AsyncJob.job_type.in_(list(job_types)),
        _WAITING_SINCE < cutoff,
    ]


async def count_waiting(session: AsyncSession, job_types: Sequence[str], cutoff: datetime) -> int:
    """PENDING jobs of these types that have been waiting for a delivery since before
    `cutoff`."""
    count = await session.scalar(
        select(func.count()).select_from(AsyncJob).where(*_waiting(job_types, cutoff))
    )
    return int(count or 0)


async def longest_waiting(
    session: AsyncSession, job_types: Sequence[str], cutoff: datetime, limit: int
) -> dict[uuid.UUID, datetime]:
    """The `limit` jobs of `count_waiting` that have waited longest, with their
    `updated_at` (which a re-publication changes: the check's fence)."""
    rows = await session.execute(
        select(AsyncJob.job_id, AsyncJob.updated_at)
        .where(*_waiting(job_types, cutoff))
        .order_by(_WAITING_SINCE, AsyncJob.job_id)
        .limit(limit)
    )
    return {job_id: updated_at for job_id, updated_at in rows}


_REPUBLISH = text("""
UPDATE async_jobs AS j SET last_error = :note, updated_at = now()
FROM (
    SELECT c.job_id FROM async_jobs AS c
    JOIN unnest(CAST(:ids AS uuid[]), CAST(:seen AS timestamptz[])) AS s(job_id, updated_at)
        ON s.job_id = c.job_id AND s.updated_at = c.updated_at
    WHERE c.status = 'PENDING'
    FOR UPDATE OF c SKIP LOCKED
) AS unchanged
WHERE j.job_id = unchanged.job_id
RETURNING j.*
""")


async def mark_republished(
    session: AsyncSession, seen: Mapping[uuid.UUID, datetime], note: str
) -> list[AsyncJob]:
    """The jobs of `seen` still PENDING and unchanged since they were seen (same
    `updated_at`), now with `note` as their `last_error` and `updated_at` now: the caller
    adds their new messages. Skips a job a worker or another replica holds this moment."""
    if not seen:
        return []
    ids = list(seen)
    statement = _REPUBLISH.bindparams(
        ids=ids, seen=[seen[i] for i in ids], note=note[:MAX_ERROR_MESSAGE]
    )
    jobs = await session.scalars(
        select(AsyncJob).from_statement(statement).execution_options(populate_existing=True)
    )
    return list(jobs)


async def delete_published_before(session: AsyncSession, retention: timedelta, limit: int) -> int:
    """Up to `limit` outbox rows published more than `retention` ago."""
    doomed = (
        select(OutboxMessage.id)
        .where(OutboxMessage.published_at < func.now() - retention)
        .limit(limit)
        .scalar_subquery()
    )
    result = await session.execute(delete(OutboxMessage).where(OutboxMessage.id.in_(doomed)))
    return int(result.rowcount)  # type: ignore[attr-defined]


# -- per-request state of the API ---------------------------------------------------------------


async def prune_idle_buckets(session: AsyncSession, *, idle_before: datetime, limit: int) -> int:
    """Delete up to `limit` rate-limit buckets last taken before `idle_before`."""
    doomed = (
        select(RateLimitBucket.subject, RateLimitBucket.bucket)
        .where(RateLimitBucket.updated_at < idle_before)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("doomed")
    )
    result = await session.execute(
        delete(RateLimitBucket).where(
            tuple_(RateLimitBucket.subject, RateLimitBucket.bucket).in_(
                select(doomed.c.subject, doomed.c.bucket)
            ),
            RateLimitBucket.updated_at < idle_before,
        )
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


async def prune_spent_oauth_states(session: AsyncSession, *, now: datetime, limit: int) -> int:
    """Delete up to `limit` OAuth states that can never be accepted again: used or expired."""
    spent = (GithubOAuthState.used_at.is_not(None)) | (GithubOAuthState.expires_at <= now)
    doomed = (
        select(GithubOAuthState.state_hash)
        .where(spent)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("doomed")
    )
    result = await session.execute(
        delete(GithubOAuthState).where(
            GithubOAuthState.state_hash.in_(select(doomed.c.state_hash)), spent
        )
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
