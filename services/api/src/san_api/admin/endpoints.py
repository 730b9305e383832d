"""The admin API under /admin/api (operator role on every route; see admin/auth.py)."""

from __future__ import annotations

import base64
import binascii
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.admin import repository, service
from san_api.admin.auth import CurrentOperator, get_operator
from san_api.admin.broker import BrokerAdmin, DeadLetter, Selector, Settled, queue_job_type
from san_api.admin.repository import JobFilter
from san_api.admin.schemas import (
    AdminJob,
    AuditPage,
    AuditView,
    BucketCell,
    BulkIn,
    BulkPreview,
    BulkResult,
    CountCell,
    DeadLetterAction,
    DeadLetterOutcome,
    DeadLetterResult,
    DeadLettersView,
    DeadLetterView,
    JobDetail,
    JobEventView,
    JobFilterIn,
    JobListQuery,
    JobPage,
    JobTypeView,
    OutboxView,
    PendingView,
    QueuesView,
    QueueView,
    Stats,
    SweepRequestView,
    SweepRunIn,
    SweepRunView,
    SweepsView,
    TargetRow,
    TimingsView,
    TimingView,
    TryView,
    WorkersView,
    WorkerView,
)
from san_api.deps import SessionDep, SettingsDep
from san_api.errors import NotFound, ValidationFailed
from san_common import deployment
from san_common.jobs import registry
from san_common.jobs import repository as jobs
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.models.operations import SWEEP_NAMES


def _problems(*codes: int) -> dict[int | str, dict[str, object]]:
    described = {
        400: "invalid input (VALIDATION_ERROR)",
        401: "no or invalid token (UNAUTHORIZED)",
        403: "the token lacks the operator role (FORBIDDEN)",
        404: "no such job (NOT_FOUND)",
        409: "the job's state does not allow it (CONFLICT, DUPLICATE_RESOURCE)",
        503: "RabbitMQ is unavailable (BROKER_UNAVAILABLE)",
    }
    return {
        c: {"description": described[c], "content": {"application/problem+json": {}}}
        for c in (400, 401, 403, *codes)
    }


router = APIRouter(
    prefix="/admin/api", tags=["admin"], dependencies=[Depends(get_operator)], responses=_problems()
)

DEAD_LETTER_WALK_LIMIT = 10_000


def broker_admin(request: Request) -> BrokerAdmin:
    admin: BrokerAdmin = request.app.state.broker_admin
    return admin


BrokerDep = Annotated[BrokerAdmin, Depends(broker_admin)]


def sessions_of(request: Request) -> async_sessionmaker[AsyncSession]:
    factory: async_sessionmaker[AsyncSession] = request.app.state.sessions
    return factory


SessionsDep = Annotated[async_sessionmaker[AsyncSession], Depends(sessions_of)]


def admin_job(job: AsyncJob, user: str | None) -> AdminJob:
    return AdminJob(
        jobId=job.job_id,
        jobType=job.job_type,
        status=job.status,
        targetId=job.target_id,
        userId=job.user_id,
        user=user,
        attempt=job.attempt,
        errorMessage=job.error_message,
        createdAt=job.created_at,
        updatedAt=job.updated_at,
        startedAt=job.started_at,
        finishedAt=job.finished_at,
        workerId=job.worker_id,
        leaseExpiresAt=job.lease_expires_at,
        tries=job.tries,
        nextAttemptAt=job.next_attempt_at,
        lastError=job.last_error,
        errorSummary=job.error_summary,
    )


def to_filter(f: JobFilterIn) -> JobFilter:
    for low, high in ((f.createdFrom, f.createdTo), (f.finishedFrom, f.finishedTo)):
        if low and high and low > high:
            raise ValidationFailed("a range's start is after its end")
    for moment in (f.createdFrom, f.createdTo, f.finishedFrom, f.finishedTo):
        if moment is not None and moment.tzinfo is None:
            raise ValidationFailed("times need a UTC offset, e.g. 2026-12-02T10:00:00Z")
    if (f.error is not None and "\x00" in f.error) or (f.user is not None and "\x00" in f.user):
        raise ValidationFailed("text filters cannot contain NUL")
    digits = (f.jobId or "").replace("-", "")
    if f.jobId is not None and not 0 < len(digits) <= 32:
        raise ValidationFailed("jobId: one to 32 hex digits (the start of a job id)")
    return JobFilter(
        job_id_prefix=f.jobId,
        statuses=tuple(s.value for s in f.status),
        job_types=tuple(t.value for t in f.type),
        user=f.user,
        created_from=f.createdFrom,
        created_to=f.createdTo,
        finished_from=f.finishedFrom,
        finished_to=f.finishedTo,
        error=f.error,
    )


def encode_cursor(job: AsyncJob) -> str:
    raw = f"{job.created_at.isoformat()}|{job.job_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, job_id = raw.split("|", 1)
        moment = datetime.fromisoformat(at)
        if moment.tzinfo is None:
            raise ValueError("naive")
        return moment, uuid.UUID(job_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed("cursor is not one this API returned") from None


@router.get("/jobs", response_model=JobPage)
async def list_jobs(session: SessionDep, q: Annotated[JobListQuery, Query()]) -> JobPage:
    """Jobs newest first, filtered; pass `nextCursor` back as `cursor` for the next page."""
    before = decode_cursor(q.cursor) if q.cursor else None
    limit = q.limit
    rows = await repository.list_jobs(session, to_filter(q), limit=limit + 1, before=before)
    page = rows[:limit]
    return JobPage(
        items=[admin_job(r.job, r.user_external_id) for r in page],
        nextCursor=encode_cursor(page[-1].job) if len(rows) > limit else None,
    )


@router.get("/jobs/{jobId}", response_model=JobDetail, responses=_problems(404))
async def job_detail(jobId: uuid.UUID, session: SessionDep) -> JobDetail:
    """A job with its status history, tries, lease, target row and related jobs."""
    row = await repository.get_job(session, jobId)
    if row is None:
        raise NotFound(f"job {jobId} not found")
    target = await repository.target_of(session, row.job)
    related = await repository.related_jobs(session, row.job)
    events = await repository.job_events(session, jobId)
    return JobDetail(
        job=admin_job(row.job, row.user_external_id),
        events=[JobEventView(id=e.id, status=e.status, at=e.at) for e in events],
        tries=[
            TryView(
                tryNo=t.try_no,
                workerId=t.worker_id,
                startedAt=t.started_at,
                finishedAt=t.finished_at,
                outcome=t.outcome,
                error=t.error,
            )
            for t in await jobs.tries_of(session, jobId)
        ],
        target=TargetRow(table=target.table, exists=target.exists, status=target.status),
        related=[admin_job(j, row.user_external_id) for j in related],
    )


@router.post("/jobs/{jobId}/retry", response_model=AdminJob, responses=_problems(404, 409))
async def retry_job(jobId: uuid.UUID, session: SessionDep, operator: CurrentOperator) -> AdminJob:
    """Retry a FAILED job now: same job id, PENDING again, a new message (audited)."""
    await service.retry(session, operator, jobId)
    row = await repository.get_job(session, jobId)
    assert row is not None
    return admin_job(row.job, row.user_external_id)


@router.post("/jobs/{jobId}/cancel", response_model=AdminJob, responses=_problems(404, 409))
async def cancel_job(jobId: uuid.UUID, session: SessionDep, operator: CurrentOperator) -> AdminJob:
    """Cancel a PENDING (or waiting-for-retry) job: CANCELLED, terminal (audited)."""
    await service.cancel(session, operator, jobId)
    row = await repository.get_job(session, jobId)
    assert row is not None
    return admin_job(row.job, row.user_external_id)


@router.post("/jobs/bulk/preview", response_model=BulkPreview)
async def bulk_preview(body: BulkIn, session: SessionDep, settings: SettingsDep) -> BulkPreview:
    """How many jobs a bulk retry / cancel with this filter would touch."""
    seen = await service.preview(
        session, body.action, to_filter(body.filter), settings.admin_bulk_limit
    )
    return BulkPreview(
        action=body.action,
        count=seen.count,
        superseded=seen.superseded,
        skipped=_skipped(seen),
        limit=settings.admin_bulk_limit,
    )


@router.post("/jobs/bulk", response_model=BulkResult)
async def bulk_action(
    body: BulkIn, session: SessionDep, settings: SettingsDep, operator: CurrentOperator
) -> BulkResult:
    """Retry (FAILED) or cancel (PENDING) every job the filter matches (audited)."""
    done, seen, audit_id = await service.bulk(
        session, operator, body.action, to_filter(body.filter), settings.admin_bulk_limit
    )
    return BulkResult(
        action=body.action,
        count=done,
        matched=seen.matched,
        superseded=seen.superseded,
        skipped=_skipped(seen),
        auditId=audit_id,
    )


def _skipped(seen: service.Preview) -> dict[str, int]:
    return {service.SUPERSEDED: seen.superseded} if seen.superseded else {}


@router.get("/stats", response_model=Stats)
async def stats(
    session: SessionDep,
    hours: Annotated[float, Query(gt=0, le=24 * 30)] = 24,
    bucket: Annotated[Literal["hour", "minute"], Query()] = "hour",
) -> Stats:
    """Counts by job type × status: now, and per bucket of last change over `hours`."""
    since = repository.since(hours)
    cells = await repository.buckets(session, since=since, bucket=bucket)
    return Stats(
        totals=[
            CountCell(jobType=t, status=s, count=n) for t, s, n in await repository.totals(session)
        ],
        buckets=[BucketCell(at=a, jobType=t, status=s, count=n) for a, t, s, n in cells],
        bucket=bucket,
        since=since,
    )


# A worker that missed this many beats is shown as gone (dead, paused or cut off).
MISSED_BEATS = 3


@router.get("/workers", response_model=WorkersView)
async def workers(session: SessionDep) -> WorkersView:
    """Worker processes, newest first: what each consumes, the jobs it holds now and its
    last beat. One that stopped cleanly is gone from the list; one that died stays, shown
    not alive, for a day."""
    items = [
        WorkerView(
            workerId=row.worker.worker_id,
            host=row.worker.host,
            pid=row.worker.pid,
            jobTypes=row.worker.job_types,
            inFlight=sum(row.running.values()),
            running=row.running,
            startedAt=row.worker.started_at,
            lastHeartbeatAt=row.worker.heartbeat_at,
            silentSeconds=round(row.silent_seconds, 3),
            beatSeconds=row.worker.beat_seconds,
            alive=row.silent_seconds <= MISSED_BEATS * row.worker.beat_seconds,
        )
        for row in await repository.workers(session)
    ]
    return WorkersView(items=items, alive=sum(w.alive for w in items))


@router.get("/timings", response_model=TimingsView)
async def timings(
    session: SessionDep,
    broker: BrokerDep,
    minutes: Annotated[int, Query(ge=1, le=24 * 60)] = 60,
) -> TimingsView:
    """Wait and run time p50/p95 per job type over the last `minutes`, and per queue the
    PENDING jobs and how long the oldest due one has waited."""
    topology = broker.topology  # names only: the broker is not asked
    by_queue: dict[str, list[repository.Waiting]] = {}
    for row in await repository.waiting(session):
        queue = topology.queue_name(row.job_type) if registry.find(row.job_type) else "?"
        by_queue.setdefault(queue, []).append(row)
    ages = {q: [r.oldest_due_seconds for r in rows if r.oldest_due_seconds is not None]
            for q, rows in by_queue.items()}  # fmt: skip
    return TimingsView(
        minutes=minutes,
        since=repository.since(minutes / 60),
        jobTypes=[
            TimingView(
                jobType=t.job_type,
                finished=t.finished,
                waitP50=t.wait_p50,
                waitP95=t.wait_p95,
                runP50=t.run_p50,
                runP95=t.run_p95,
            )
            for t in await repository.timings(session, seconds=minutes * 60)
        ],
        queues=[
            PendingView(
                queue=queue,
                jobTypes=[r.job_type for r in rows],
                pending=sum(r.pending for r in rows),
                due=sum(r.due for r in rows),
                oldestDueSeconds=round(max(ages[queue]), 3) if ages[queue] else None,
            )
            for queue, rows in sorted(by_queue.items())
        ],
    )


@router.get("/outbox", response_model=OutboxView)
async def outbox(session: SessionDep) -> OutboxView:
    """Messages the relay has not published yet, and how old the oldest is."""
    count, oldest = await repository.outbox_backlog(session)
    age = (datetime.now(UTC) - oldest).total_seconds() if oldest else None
    return OutboxView(unpublished=count, oldestAgeSeconds=age)


@router.get("/queues", response_model=QueuesView, responses=_problems(503))
async def queues(session: SessionDep, broker: BrokerDep) -> QueuesView:
    """Depth, consumers (and unacked, with the management API) of every queue."""
    source, depths = await broker.depths()
    paused = {p.job_type for p in await repository.paused(session)}
    views = []
    for depth in depths:
        job_type = queue_job_type(broker.topology, depth.name)
        views.append(
            QueueView(
                name=depth.name,
                jobType=job_type,
                messages=depth.messages,
                consumers=depth.consumers,
                unacked=depth.unacked,
                paused=job_type in paused,
            )
        )
    return QueuesView(source=source, queues=views)


@router.get("/job-types", response_model=list[JobTypeView])
async def job_types(session: SessionDep) -> list[JobTypeView]:
    """Every job type and whether it is paused."""
    paused = {p.job_type: p for p in await repository.paused(session)}
    return [
        JobTypeView(
            jobType=t,
            paused=t in paused,
            pausedBy=paused[t].paused_by if t in paused else None,
            pausedAt=paused[t].paused_at if t in paused else None,
        )
        for t in registry.job_types()
    ]


@router.post("/job-types/{jobType}/pause", response_model=JobTypeView)
async def pause(jobType: JobType, session: SessionDep, operator: CurrentOperator) -> JobTypeView:
    """Stop every worker consuming this job type (within seconds, across replicas)."""
    changed = await repository.pause(session, jobType, operator.name)
    await repository.audit(
        session,
        actor=operator.name,
        action="job_type.pause",
        target=jobType.value,
        count=int(changed),
    )
    row = {p.job_type: p for p in await repository.paused(session)}[jobType.value]
    return JobTypeView(
        jobType=jobType.value, paused=True, pausedBy=row.paused_by, pausedAt=row.paused_at
    )


@router.post("/job-types/{jobType}/resume", response_model=JobTypeView)
async def resume(jobType: JobType, session: SessionDep, operator: CurrentOperator) -> JobTypeView:
    """Let workers consume this job type again."""
    changed = await repository.resume(session, jobType)
    await repository.audit(
        session,
        actor=operator.name,
        action="job_type.resume",
        target=jobType.value,
        count=int(changed),
    )
    return JobTypeView(jobType=jobType.value, paused=False, pausedBy=None, pausedAt=None)


def _letter_view(letter: DeadLetter, jobs: dict[str, AsyncJob]) -> DeadLetterView:
    job = jobs.get(letter.job_id or "")
    return DeadLetterView(
        messageId=letter.message_id,
        jobId=letter.job_id,
        jobType=letter.job_type,
        reason=letter.reason,
        detail=letter.detail,
        deadLetteredBy=letter.by,
        queue=letter.queue,
        deaths=letter.deaths,
        deadLetteredAt=letter.dead_lettered_at,
        deployment=letter.deployment,
        jobStatus=job.status if job else None,
        jobError=job.error_message if job else None,
        body=letter.body,
    )


@router.get("/dead-letters", response_model=DeadLettersView, responses=_problems(503))
async def dead_letters(
    session: SessionDep, broker: BrokerDep, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> DeadLettersView:
    """Read dead letters, in queue order, without moving them: why each was dead-lettered
    (by a worker or by RabbitMQ), when, from which queue, and its job's recorded error."""
    total, letters = await broker.peek(limit)
    jobs = await _jobs_of(session, [letter.job_id for letter in letters if letter.job_id])
    return DeadLettersView(total=total, items=[_letter_view(x, jobs) for x in letters])


async def _jobs_of(session: AsyncSession, job_ids: list[str]) -> dict[str, AsyncJob]:
    ids = []
    for job_id in job_ids:
        try:
            ids.append(uuid.UUID(job_id))
        except ValueError:
            continue
    return {str(j.job_id): j for j in await repository.jobs_by_id(session, ids)}


def _selector(body: DeadLetterAction) -> Selector:
    chosen = sum((body.all, body.messageId is not None, body.jobType is not None))
    if chosen != 1:
        raise ValidationFailed("name exactly one of: messageId, jobType, all=true")
    if body.messageId is not None:
        return lambda letter: letter.message_id == body.messageId
    if body.jobType is not None:
        wanted = body.jobType.value
        return lambda letter: letter.job_type == wanted
    return lambda _letter: True


async def _dead_letter_action(
    action: str,
    body: DeadLetterAction,
    session: AsyncSession,
    sessions: async_sessionmaker[AsyncSession],
    broker: BrokerAdmin,
    operator: str,
) -> DeadLetterResult:
    select = _selector(body)
    target = body.messageId or (body.jobType.value if body.jobType else "all")
    # The broker cannot join our transaction: the audit row is committed before the
    # broker is touched, and completed with the count afterwards.
    async with sessions() as audit_session, audit_session.begin():
        audit_id = await repository.audit(
            audit_session,
            actor=operator,
            action=f"dlq.{action}",
            target=target,
            detail={"state": "started"},
        )
    settled: list[Settled] = []
    if action == "redrive":

        async def known_jobs(job_ids: list[str]) -> set[str]:
            return set(await _jobs_of(session, job_ids))

        settled = await broker.redrive(
            select,
            DEAD_LETTER_WALK_LIMIT,
            deployment_id=await deployment.identity_in(session),
            known_jobs=known_jobs,
        )
        count = sum(s.result == "redriven" for s in settled)
    elif body.all:
        count = await broker.purge_all()
    else:
        settled = await broker.purge(select, DEAD_LETTER_WALK_LIMIT)
        count = len(settled)
    tally = Counter(s.result for s in settled)
    not_redrivable, failed = tally["not-redrivable"], tally["failed"]
    await repository.set_audit_count(
        session,
        audit_id,
        count,
        {"state": "done", "notRedrivable": not_redrivable, "failed": failed},
    )
    return DeadLetterResult(
        action=action,
        count=count,
        notRedrivable=not_redrivable,
        failed=failed,
        items=[
            DeadLetterOutcome(
                messageId=s.letter.message_id,
                jobId=s.letter.job_id,
                jobType=s.letter.job_type,
                result=s.result,
                reason=s.reason,
            )
            for s in settled
        ],
        auditId=audit_id,
    )


@router.post("/dead-letters/redrive", response_model=DeadLetterResult, responses=_problems(503))
async def redrive(
    body: DeadLetterAction,
    session: SessionDep,
    sessions: SessionsDep,
    broker: BrokerDep,
    operator: CurrentOperator,
) -> DeadLetterResult:
    """Publish dead letters (one, one job type's, or all) to their job type's queue again,
    with confirms. Each selected one is reported: re-driven, not re-drivable (and why: it
    could only be dead-lettered again), or failed (the broker did not confirm it); only
    re-driven ones leave the dead-letter queue."""
    return await _dead_letter_action("redrive", body, session, sessions, broker, operator.name)


@router.post("/dead-letters/purge", response_model=DeadLetterResult, responses=_problems(503))
async def purge(
    body: DeadLetterAction,
    session: SessionDep,
    sessions: SessionsDep,
    broker: BrokerDep,
    operator: CurrentOperator,
) -> DeadLetterResult:
    """Drop dead letters (one, one job type's, or all)."""
    return await _dead_letter_action("purge", body, session, sessions, broker, operator.name)


@router.get("/sweeps", response_model=SweepsView)
async def sweeps(
    session: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> SweepsView:
    """Recovery sweep runs (newest first) and operators' pending "run now" requests."""
    runs = await repository.sweep_runs(session, limit=limit)
    requests = await repository.sweep_requests(session, limit=limit)
    return SweepsView(
        runs=[
            SweepRunView(
                id=r.id,
                sweep=r.sweep,
                trigger=r.trigger,
                status=r.status,
                startedAt=r.started_at,
                finishedAt=r.finished_at,
                batches=r.batches,
                totals=r.totals,
                error=r.error,
            )
            for r in runs
        ],
        requests=[
            SweepRequestView(
                id=q.id,
                sweeps=q.sweeps,
                requestedBy=q.requested_by,
                requestedAt=q.requested_at,
                startedAt=q.started_at,
                finishedAt=q.finished_at,
                ok=q.ok,
                attempts=q.attempts,
                error=q.error,
            )
            for q in requests
        ],
    )


@router.post("/sweeps/run", response_model=SweepRequestView, status_code=202)
async def run_sweeps(
    body: SweepRunIn, session: SessionDep, operator: CurrentOperator
) -> SweepRequestView:
    """Ask the recovery service to run these sweeps now (it picks the request up within
    seconds); `all` runs every sweep."""
    names = list(SWEEP_NAMES) if "all" in body.sweeps else body.sweeps
    unknown = sorted(set(names) - set(SWEEP_NAMES))
    if unknown:
        raise ValidationFailed(
            f"unknown sweep(s) {', '.join(unknown)}; choose from {', '.join(SWEEP_NAMES)}, all"
        )
    ordered = [n for n in SWEEP_NAMES if n in names]
    request_id = await repository.request_sweeps(session, ordered, operator.name)
    await repository.audit(
        session,
        actor=operator.name,
        action="sweeps.run",
        target=",".join(ordered),
        count=1,
        detail={"request_id": request_id},
    )
    request = next(
        q for q in await repository.sweep_requests(session, limit=5) if q.id == request_id
    )
    return SweepRequestView(
        id=request.id,
        sweeps=request.sweeps,
        requestedBy=request.requested_by,
        requestedAt=request.requested_at,
        startedAt=None,
        finishedAt=None,
        ok=None,
    )


@router.get("/audit", response_model=AuditPage)
async def audit_log(
    session: SessionDep,
    cursor: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """Operator actions, newest first."""
    rows = await repository.audit_log(session, limit=limit + 1, before=cursor)
    page = rows[:limit]
    return AuditPage(
        items=[
            AuditView(
                id=a.id,
                at=a.at,
                actor=a.actor,
                action=a.action,
                target=a.target,
                filter=a.filter,
                count=a.count,
                detail=a.detail,
            )
            for a in page
        ],
        nextCursor=page[-1].id if len(rows) > limit else None,
    )
