"""Job control for operators: retry (same job id), cancel, and both in bulk by filter.
Every action is an event of `jobs.lifecycle` and writes its audit row in the action's own
transaction (the request's). A retry leaves a FAILED job that a newer job of its target
and type superseded: that work was done again (or is under way) already."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from san_api.admin import repository
from san_api.admin.auth import Operator
from san_api.admin.repository import JobFilter
from san_api.errors import Conflict, DuplicateResource, NotFound, ValidationFailed
from san_api.jobs import cancelling
from san_common.jobs import lifecycle
from san_common.jobs import repository as jobs
from san_common.jobs.types import JobStatus

SUPERSEDED = "superseded: a newer job of the same target and type exists"


def _cancel_reason(operator: Operator) -> str:
    return f"cancelled by operator {operator.name}"


async def retry(session: AsyncSession, operator: Operator, job_id: uuid.UUID) -> uuid.UUID:
    row = await repository.get_job(session, job_id)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    if row.job.status != JobStatus.FAILED.value:
        raise Conflict(f"job {job_id} is {row.job.status}; only FAILED jobs can be retried")
    retried = await _retry(session, [job_id])
    if not retried:
        if await lifecycle.superseded(session, [job_id]):
            if await jobs.find_active(session, row.job.target_id, row.job.job_type):
                raise DuplicateResource(
                    f"another {row.job.job_type} job for target {row.job.target_id} is active"
                )
            raise Conflict(f"job {job_id} is not retried: {SUPERSEDED}")
        raise Conflict(f"job {job_id} changed meanwhile; reload and try again")
    await repository.audit(
        session, actor=operator.name, action="job.retry", target=str(job_id), count=1
    )
    return retried[0]


async def cancel(session: AsyncSession, operator: Operator, job_id: uuid.UUID) -> None:
    row = await repository.get_job(session, job_id)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    await cancelling.cancel(session, row.job, _cancel_reason(operator), "cancelled by an operator")
    await repository.audit(
        session, actor=operator.name, action="job.cancel", target=str(job_id), count=1
    )


@dataclass(frozen=True)
class Preview:
    """What a bulk action would do now: `count` jobs touched, `superseded` FAILED jobs a
    retry skips; `matched` (capped at the limit + 1) is what the filter matched."""

    count: int
    superseded: int
    matched: int


async def preview(session: AsyncSession, action: str, f: JobFilter, limit: int) -> Preview:
    """How many jobs the bulk action would touch now (capped at `limit` + 1)."""
    if action == "retry":
        failed = await repository.failed_ids(session, f, limit=limit + 1)
        superseded = len(await lifecycle.superseded(session, failed))
        return Preview(len(failed) - superseded, superseded, len(failed))
    pending = JobFilter(**{**f.__dict__, "statuses": (JobStatus.PENDING.value,)})
    count = await repository.count_jobs(session, pending)
    return Preview(count, 0, count)


async def bulk(
    session: AsyncSession, operator: Operator, action: str, f: JobFilter, limit: int
) -> tuple[int, Preview, int]:
    """(count done, the preview it ran on, audit id)."""
    seen = await preview(session, action, f, limit)
    if seen.matched > limit:
        raise ValidationFailed(
            f"the filter matches {seen.matched} jobs, more than the bulk limit of {limit}; "
            "narrow it"
        )
    if action == "retry":
        # Superseded jobs are left by the lifecycle itself, under the jobs' locks: one that
        # became superseded since the preview is skipped too.
        done = len(await _retry(session, await repository.failed_ids(session, f, limit=limit)))
    else:
        ids = await repository.cancellable_ids(session, f, limit=limit)
        done = await lifecycle.cancel(session, ids, _cancel_reason(operator))
    audit_id = await repository.audit(
        session,
        actor=operator.name,
        action=f"jobs.bulk_{action}",
        filter=f.as_dict(),
        count=done,
        detail={"matched": seen.matched, "superseded": seen.superseded},
    )
    return done, seen, audit_id


async def superseded_since(session: AsyncSession, since: datetime) -> int:
    """FAILED jobs changed since `since` that a newer job superseded."""
    return await lifecycle.count_superseded(session, since=since)


async def _retry(session: AsyncSession, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    try:
        async with session.begin_nested():
            return await lifecycle.retry(session, ids)
    except IntegrityError as exc:  # a registration raced us onto the unique index
        raise DuplicateResource(
            "an active job for the same target and type appeared meanwhile; try again"
        ) from exc
