"""Queries of the operator console: jobs with filters and keyset pagination, counts, the
outbox backlog, the audit log, pauses, sweep history, and the job-control updates."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs import registry
from san_common.jobs.types import JobStatus, JobType
from san_common.models import (
    AdminAudit,
    AsyncJob,
    AsyncJobEvent,
    JobTypePause,
    OutboxMessage,
    SweepRequest,
    SweepRun,
    User,
    WorkerPresence,
)


@dataclass(frozen=True)
class JobFilter:
    statuses: tuple[str, ...] = ()
    job_types: tuple[str, ...] = ()
    user: str | None = None  # the user's external id (what operators know) or its uuid
    created_from: datetime | None = None
    created_to: datetime | None = None
    finished_from: datetime | None = None
    finished_to: datetime | None = None
    error: str | None = None
    job_id: uuid.UUID | None = None
    job_id_prefix: str | None = None  # hex digits, dashes allowed (see `id_range`)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.__dict__.items():
            if value in (None, ()):
                continue
            if isinstance(value, datetime | uuid.UUID):
                out[key] = str(value)
            elif isinstance(value, tuple):
                out[key] = list(value)
            else:
                out[key] = value
        return out


def id_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID]:
    """The first and last job ids that start with `prefix` (hex digits, dashes ignored):
    a range on the primary key, so a prefix search is an index scan."""
    digits = prefix.replace("-", "").lower()
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def _conditions(f: JobFilter) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if f.job_id:
        where.append(AsyncJob.job_id == f.job_id)
    if f.job_id_prefix:
        where.append(AsyncJob.job_id.between(*id_range(f.job_id_prefix)))
    if f.statuses:
        where.append(AsyncJob.status.in_(f.statuses))
    if f.job_types:
        where.append(AsyncJob.job_type.in_(f.job_types))
    if f.user:
        users = select(User.id).where(User.external_id == f.user)
        try:
            where.append(or_(AsyncJob.user_id == uuid.UUID(f.user), AsyncJob.user_id.in_(users)))
        except ValueError:
            where.append(AsyncJob.user_id.in_(users))
    if f.created_from:
        where.append(AsyncJob.created_at >= f.created_from)
    if f.created_to:
        where.append(AsyncJob.created_at < f.created_to)
    if f.finished_from:
        where.append(AsyncJob.finished_at >= f.finished_from)
    if f.finished_to:
        where.append(AsyncJob.finished_at < f.finished_to)
    if f.error:
        where.append(AsyncJob.error_message.icontains(f.error, autoescape=True))
    return where


@dataclass(frozen=True)
class JobRow:
    job: AsyncJob
    user_external_id: str | None


def _with_user(*where: ColumnElement[bool]) -> Select[AsyncJob, str]:
    return (
        select(AsyncJob, User.external_id)
        .outerjoin(User, User.id == AsyncJob.user_id)
        .where(*where)
    )


async def list_jobs(
    session: AsyncSession,
    f: JobFilter,
    *,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None = None,
) -> list[JobRow]:
    """Newest first; `before` is the (created_at, job_id) of the last row of the previous
    page (keyset pagination: stable while rows are added)."""
    where = _conditions(f)
    if before is not None:
        where.append(tuple_(AsyncJob.created_at, AsyncJob.job_id) < tuple_(*before))
    rows = await session.execute(
        _with_user(*where).order_by(AsyncJob.created_at.desc(), AsyncJob.job_id.desc()).limit(limit)
    )
    return [JobRow(row[0], row[1]) for row in rows]


async def count_jobs(session: AsyncSession, f: JobFilter) -> int:
    return int(
        await session.scalar(select(func.count()).select_from(AsyncJob).where(*_conditions(f))) or 0
    )


async def get_job(session: AsyncSession, job_id: uuid.UUID) -> JobRow | None:
    row = (await session.execute(_with_user(AsyncJob.job_id == job_id))).first()
    return None if row is None else JobRow(row[0], row[1])


async def jobs_by_id(session: AsyncSession, ids: Sequence[uuid.UUID]) -> Sequence[AsyncJob]:
    if not ids:
        return []
    return (await session.scalars(select(AsyncJob).where(AsyncJob.job_id.in_(ids)))).all()


async def related_jobs(session: AsyncSession, job: AsyncJob, *, limit: int = 20) -> list[AsyncJob]:
    rows = await session.scalars(
        select(AsyncJob)
        .where(AsyncJob.target_id == job.target_id, AsyncJob.job_id != job.job_id)
        .order_by(AsyncJob.created_at.desc())
        .limit(limit)
    )
    return list(rows)


async def job_events(session: AsyncSession, job_id: uuid.UUID) -> Sequence[AsyncJobEvent]:
    rows = await session.scalars(
        select(AsyncJobEvent).where(AsyncJobEvent.job_id == job_id).order_by(AsyncJobEvent.id)
    )
    return rows.all()


@dataclass(frozen=True)
class TargetView:
    table: str
    exists: bool
    status: str | None


async def target_of(session: AsyncSession, job: AsyncJob) -> TargetView:
    """The job's target row and, where it mirrors the job, its status (the registry's)."""
    spec = registry.find(job.job_type)
    if spec is None:  # a type no longer served: its target is unknown
        return TargetView("?", False, None)
    table = spec.target
    column = table.c.id if spec.mirror is None else table.c[spec.mirror.status_column]
    found = (await session.execute(select(column).where(table.c.id == job.target_id))).first()
    status = None if found is None or spec.mirror is None else found[0]
    return TargetView(table.name, found is not None, status)


# -- counts, outbox ---------------------------------------------------------------------------


async def totals(session: AsyncSession) -> list[tuple[str, str, int]]:
    rows = await session.execute(
        select(AsyncJob.job_type, AsyncJob.status, func.count())
        .group_by(AsyncJob.job_type, AsyncJob.status)
        .order_by(AsyncJob.job_type, AsyncJob.status)
    )
    return [(t, s, int(n)) for t, s, n in rows]


async def buckets(
    session: AsyncSession, *, since: datetime, bucket: str
) -> list[tuple[datetime, str, str, int]]:
    """Jobs by hour (or minute) of their last change, by type and status."""
    at = func.date_trunc(bucket, AsyncJob.updated_at).label("at")
    rows = await session.execute(
        select(at, AsyncJob.job_type, AsyncJob.status, func.count())
        .where(AsyncJob.updated_at >= since)
        .group_by(at, AsyncJob.job_type, AsyncJob.status)
        .order_by(at)
    )
    return [(a, t, s, int(n)) for a, t, s, n in rows]


async def outbox_backlog(session: AsyncSession) -> tuple[int, datetime | None]:
    row = (
        await session.execute(
            select(func.count(), func.min(OutboxMessage.created_at)).where(
                OutboxMessage.published_at.is_(None)
            )
        )
    ).one()
    return int(row[0]), row[1]


# -- the fleet at a glance ---------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRow:
    worker: WorkerPresence
    silent_seconds: float  # since its last beat, by the database's clock
    running: dict[str, int]  # PROCESSING jobs it holds, by job type


async def workers(session: AsyncSession) -> list[WorkerRow]:
    """Every worker with a presence row, newest first, and the jobs each holds now."""
    silent = func.extract("epoch", func.now() - WorkerPresence.heartbeat_at)
    rows = (
        await session.execute(
            select(WorkerPresence, silent).order_by(
                WorkerPresence.started_at.desc(), WorkerPresence.worker_id
            )
        )
    ).all()
    held = await session.execute(
        select(AsyncJob.worker_id, AsyncJob.job_type, func.count())
        .where(
            AsyncJob.status == JobStatus.PROCESSING.value,
            AsyncJob.worker_id.in_([row[0].worker_id for row in rows]),
        )
        .group_by(AsyncJob.worker_id, AsyncJob.job_type)
    )
    running: dict[str, dict[str, int]] = {}
    for worker_id, job_type, count in held:
        running.setdefault(str(worker_id), {})[job_type] = int(count)
    return [WorkerRow(w, float(age), running.get(w.worker_id, {})) for w, age in rows]


@dataclass(frozen=True)
class Timings:
    """Seconds, over the jobs of one type that finished (COMPLETED or FAILED) in the
    window: wait = created → its first try started; run = its last try, start → end."""

    job_type: str
    finished: int
    wait_p50: float | None
    wait_p95: float | None
    run_p50: float | None
    run_p95: float | None


# One statement: the jobs finished in the window (index status, finished_at), each with
# its first try (the tries' primary key).
_TIMINGS = text(
    """
    SELECT job_type,
           count(*),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY wait),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY wait),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY run),
           percentile_cont(0.95) WITHIN GROUP (ORDER BY run)
    FROM (
        SELECT j.job_type,
               extract(epoch FROM t.started_at - j.created_at) AS wait,
               extract(epoch FROM j.finished_at - j.started_at) AS run
        FROM async_jobs j
        LEFT JOIN async_job_tries t ON t.job_id = j.job_id AND t.try_no = 1
        WHERE j.status IN ('COMPLETED', 'FAILED')
          AND j.finished_at >= now() - make_interval(secs => :seconds)
    ) finished
    GROUP BY job_type
    ORDER BY job_type
    """
)


async def timings(session: AsyncSession, *, seconds: float) -> list[Timings]:
    rows = await session.execute(_TIMINGS, {"seconds": seconds})
    return [
        Timings(t, int(n), *(None if v is None else float(v) for v in (w50, w95, r50, r95)))
        for t, n, w50, w95, r50, r95 in rows
    ]


@dataclass(frozen=True)
class Waiting:
    job_type: str
    pending: int
    due: int  # PENDING and due now: not waiting for a retry's time
    oldest_due_seconds: float | None  # how long the longest-waiting due job has been due


async def waiting(session: AsyncSession) -> list[Waiting]:
    """PENDING jobs by type. A job waiting for its retry's time is not late; one that is
    due counts from when it became due (created, or its retry's time)."""
    due_since = func.coalesce(AsyncJob.next_attempt_at, AsyncJob.created_at)
    is_due = due_since <= func.now()
    rows = await session.execute(
        select(
            AsyncJob.job_type,
            func.count(),
            func.count().filter(is_due),
            func.extract("epoch", func.now() - func.min(due_since).filter(is_due)),
        )
        .where(AsyncJob.status == JobStatus.PENDING.value)
        .group_by(AsyncJob.job_type)
        .order_by(AsyncJob.job_type)
    )
    return [
        Waiting(t, int(n), int(d), None if age is None else float(age)) for t, n, d, age in rows
    ]


# -- audit ------------------------------------------------------------------------------------


async def audit(
    session: AsyncSession,
    *,
    actor: str,
    action: str,
    target: str | None = None,
    filter: dict[str, Any] | None = None,
    count: int = 0,
    detail: dict[str, Any] | None = None,
) -> int:
    audit_id: int = await session.scalar(  # type: ignore[assignment]
        insert(AdminAudit)
        .values(
            actor=actor, action=action, target=target, filter=filter, count=count, detail=detail
        )
        .returning(AdminAudit.id)
    )
    return audit_id


async def set_audit_count(
    session: AsyncSession, audit_id: int, count: int, detail: dict[str, Any] | None = None
) -> None:
    values: dict[str, Any] = {"count": count}
    if detail is not None:
        values["detail"] = detail
    await session.execute(update(AdminAudit).where(AdminAudit.id == audit_id).values(**values))


async def audit_log(
    session: AsyncSession, *, limit: int, before: int | None = None
) -> Sequence[AdminAudit]:
    query = select(AdminAudit).order_by(AdminAudit.id.desc()).limit(limit)
    if before is not None:
        query = query.where(AdminAudit.id < before)
    return (await session.scalars(query)).all()


# -- job control ------------------------------------------------------------------------------


async def failed_ids(session: AsyncSession, f: JobFilter, *, limit: int) -> list[uuid.UUID]:
    """FAILED jobs matching `f` (a bulk retry's candidates; `lifecycle.retry` decides)."""
    failed = JobFilter(**{**f.__dict__, "statuses": (JobStatus.FAILED.value,)})
    query = (
        select(AsyncJob.job_id)
        .where(*_conditions(failed))
        .order_by(AsyncJob.created_at, AsyncJob.job_id)
        .limit(limit)
    )
    return list((await session.scalars(query)).all())


async def cancellable_ids(session: AsyncSession, f: JobFilter, *, limit: int) -> list[uuid.UUID]:
    """PENDING jobs matching `f`, locked; rows a worker is claiming right now are skipped."""
    pending = JobFilter(**{**f.__dict__, "statuses": (JobStatus.PENDING.value,)})
    query = select(AsyncJob.job_id).where(*_conditions(pending)).limit(limit)
    return list((await session.scalars(query.with_for_update(skip_locked=True))).all())


# -- pauses -----------------------------------------------------------------------------------


async def paused(session: AsyncSession) -> Sequence[JobTypePause]:
    return (await session.scalars(select(JobTypePause).order_by(JobTypePause.job_type))).all()


async def pause(session: AsyncSession, job_type: JobType, by: str) -> bool:
    created = await session.scalar(
        pg_insert(JobTypePause)
        .values(job_type=job_type.value, paused_by=by)
        .on_conflict_do_nothing(index_elements=["job_type"])
        .returning(JobTypePause.job_type)
    )
    return created is not None


async def resume(session: AsyncSession, job_type: JobType) -> bool:
    result = await session.execute(
        delete(JobTypePause).where(JobTypePause.job_type == job_type.value)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


# -- sweeps -----------------------------------------------------------------------------------


async def sweep_runs(session: AsyncSession, *, limit: int) -> Sequence[SweepRun]:
    return (await session.scalars(select(SweepRun).order_by(SweepRun.id.desc()).limit(limit))).all()


async def sweep_requests(session: AsyncSession, *, limit: int) -> Sequence[SweepRequest]:
    return (
        await session.scalars(select(SweepRequest).order_by(SweepRequest.id.desc()).limit(limit))
    ).all()


async def request_sweeps(session: AsyncSession, sweeps: Sequence[str], by: str) -> int:
    request_id: int = await session.scalar(  # type: ignore[assignment]
        insert(SweepRequest).values(sweeps=list(sweeps), requested_by=by).returning(SweepRequest.id)
    )
    return request_id


def since(hours: float) -> datetime:
    return datetime.now(UTC) - timedelta(hours=hours)


# -- scheduling: upstream budgets and each user's share ------------------------------------

# What `san_common.quotas` would find in each budget now: a window that ended has its
# whole limit again (an unknown limit stays unknown) and no call in flight.
_BUDGETS = text(
    """
    SELECT q.key,
        q.requests_limit,
        CASE WHEN r.ended THEN q.requests_limit ELSE q.requests_remaining END
            AS requests_remaining,
        CASE WHEN r.ended THEN NULL ELSE q.requests_reset_at END AS requests_reset_at,
        q.tokens_limit,
        CASE WHEN t.ended THEN q.tokens_limit ELSE q.tokens_remaining END AS tokens_remaining,
        CASE WHEN t.ended THEN NULL ELSE q.tokens_reset_at END AS tokens_reset_at,
        CASE WHEN r.ended THEN 0 ELSE q.in_flight END AS in_flight,
        q.waits,
        q.updated_at,
        (SELECT count(*) FROM async_jobs AS j
            WHERE j.status = 'PENDING' AND j.waiting_for = 'upstream-quota'
              AND j.waiting_key = q.key AND j.next_attempt_at > now()) AS jobs_waiting
    FROM upstream_quotas AS q,
        LATERAL (SELECT q.requests_reset_at IS NULL OR q.requests_reset_at <= now() AS ended) r,
        LATERAL (SELECT q.tokens_reset_at IS NULL OR q.tokens_reset_at <= now() AS ended) t
    ORDER BY q.key
    """
)


@dataclass(frozen=True)
class Budget:
    key: str
    requests_limit: int | None
    requests_remaining: int | None
    requests_reset_at: datetime | None
    tokens_limit: int | None
    tokens_remaining: int | None
    tokens_reset_at: datetime | None
    in_flight: int
    refused: int
    updated_at: datetime
    jobs_waiting: int


async def upstream_budgets(session: AsyncSession) -> list[Budget]:
    """Every upstream budget as it stands now, with the jobs waiting for its reset."""
    return [Budget(*row) for row in await session.execute(_BUDGETS)]


# Active jobs per (job type, user): running, PENDING, of those the ones waiting for a
# quota's or a budget's reset, and the due messages still in the outbox, which the relay
# admits into the queue by fair share (docs/architecture.md, "Fair share and priorities");
# the user's share weight. The status condition is served by the status indexes.
_SHARES = text(
    """
    WITH held AS (
        SELECT routing_key AS job_type, user_id, count(*) AS n FROM outbox_messages
        WHERE published_at IS NULL AND available_at <= now()
        GROUP BY routing_key, user_id
    )
    SELECT j.job_type, j.user_id, u.external_id, u.share_weight,
        count(*) FILTER (WHERE j.status = 'PROCESSING') AS running,
        count(*) FILTER (WHERE j.status = 'PENDING') AS pending,
        count(*) FILTER (WHERE j.status = 'PENDING' AND j.waiting_for IS NOT NULL
            AND j.next_attempt_at > now()) AS waiting,
        coalesce(max(h.n), 0) AS awaiting_admission,
        sum(count(*) FILTER (WHERE j.status = 'PROCESSING'))
            OVER (PARTITION BY j.job_type) AS running_of_type
    FROM async_jobs AS j
    LEFT JOIN users AS u ON u.id = j.user_id
    LEFT JOIN held AS h ON h.job_type = j.job_type AND h.user_id = j.user_id
    WHERE j.status IN ('PENDING', 'PROCESSING')
    GROUP BY j.job_type, j.user_id, u.external_id, u.share_weight
    ORDER BY j.job_type, running DESC, pending DESC, j.user_id
    LIMIT :limit
    """
)


@dataclass(frozen=True)
class Share:
    job_type: str
    user_id: uuid.UUID
    external_id: str | None
    weight: float | None
    running: int
    pending: int
    waiting: int
    awaiting_admission: int
    running_of_type: int


async def user_shares(session: AsyncSession, *, limit: int) -> list[Share]:
    """Each user's active jobs per job type, the busiest first within a type."""
    rows = await session.execute(_SHARES, {"limit": limit})
    return [
        Share(t, u, e, None if sw is None else float(sw), int(r), int(p), int(w), int(a), int(rt))
        for t, u, e, sw, r, p, w, a, rt in rows
    ]
