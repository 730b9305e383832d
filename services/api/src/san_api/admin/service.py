"""Job control for operators: retry (same job id), cancel, and both in bulk by filter.
Every action writes its audit row in the action's own transaction (the request's)."""

from __future__ import annotations

import uuid

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from san_api.admin import repository
from san_api.admin.auth import Operator
from san_api.admin.repository import JobFilter
from san_api.errors import Conflict, DuplicateResource, NotFound, ValidationFailed
from san_common.jobs.types import JobStatus


def _cancel_reason(operator: Operator) -> str:
    return f"cancelled by operator {operator.name}"


async def retry(session: AsyncSession, operator: Operator, job_id: uuid.UUID) -> uuid.UUID:
    row = await repository.get_job(session, job_id)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    if row.job.status != JobStatus.FAILED.value:
        raise Conflict(f"job {job_id} is {row.job.status}; only FAILED jobs can be retried")
    if await repository.has_other_active(session, row.job):
        raise DuplicateResource(
            f"another {row.job.job_type} job for target {row.job.target_id} is active"
        )
    retried = await _make_available(session, [job_id])
    if not retried:
        raise Conflict(f"job {job_id} changed meanwhile; reload and try again")
    await repository.audit(
        session, actor=operator.name, action="job.retry", target=str(job_id), count=1
    )
    return retried[0]


async def cancel(session: AsyncSession, operator: Operator, job_id: uuid.UUID) -> None:
    row = await repository.get_job(session, job_id)
    if row is None:
        raise NotFound(f"job {job_id} not found")
    if row.job.status != JobStatus.PENDING.value:
        raise Conflict(
            f"job {job_id} is {row.job.status}; only PENDING (or waiting) jobs can be cancelled"
        )
    count = await repository.cancel(
        session, JobFilter(job_id=job_id), reason=_cancel_reason(operator), limit=1
    )
    if count == 0:
        raise Conflict(f"job {job_id} was claimed meanwhile; it can no longer be cancelled")
    await repository.audit(
        session, actor=operator.name, action="job.cancel", target=str(job_id), count=1
    )


async def preview(session: AsyncSession, action: str, f: JobFilter, limit: int) -> int:
    """How many jobs the bulk action would touch now (capped at `limit` + 1)."""
    if action == "retry":
        return len(await repository.retryable_ids(session, f, limit=limit + 1))
    pending = JobFilter(**{**f.__dict__, "statuses": (JobStatus.PENDING.value,)})
    return await repository.count_jobs(session, pending)


async def bulk(
    session: AsyncSession, operator: Operator, action: str, f: JobFilter, limit: int
) -> tuple[int, int, int]:
    """(count done, count matched, audit id)."""
    matched = await preview(session, action, f, limit)
    if matched > limit:
        raise ValidationFailed(
            f"the filter matches {matched} jobs, more than the bulk limit of {limit}; narrow it"
        )
    if action == "retry":
        ids = await repository.retryable_ids(session, f, limit=limit)
        done = len(await _make_available(session, ids))
    else:
        done = await repository.cancel(session, f, reason=_cancel_reason(operator), limit=limit)
    audit_id = await repository.audit(
        session,
        actor=operator.name,
        action=f"jobs.bulk_{action}",
        filter=f.as_dict(),
        count=done,
        detail={"matched": matched},
    )
    return done, matched, audit_id


async def _make_available(session: AsyncSession, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    try:
        async with session.begin_nested():
            return await repository.make_available_again(session, ids)
    except IntegrityError as exc:  # a registration raced us onto the unique index
        raise DuplicateResource(
            "an active job for the same target and type appeared meanwhile; try again"
        ) from exc
