"""Cancelling one job, for its owner (`DELETE /async-jobs/{id}`) and for operators: the
same rules and the same answers (docs/operations.md, "Cancelling a job")."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from san_api.errors import Conflict, NotCancellable
from san_common.jobs import lifecycle, registry
from san_common.jobs.types import JobStatus
from san_common.models import AsyncJob

_ACTIVE = (JobStatus.PENDING.value, JobStatus.PROCESSING.value)


def _check(job: AsyncJob) -> None:
    if job.status not in _ACTIVE:
        raise Conflict(f"job {job.job_id} is {job.status}; only an active job can be cancelled")
    spec = registry.find(job.job_type)
    if job.status == JobStatus.PROCESSING.value and (
        spec is None or not spec.cancellable_while_running
    ):
        raise NotCancellable(
            f"job {job.job_id} ({job.job_type}) is running and may already have made its"
            " change; it is left to complete"
        )


async def cancel(session: AsyncSession, job: AsyncJob, reason: str, owner_message: str) -> None:
    """Cancel `job` (PENDING, or PROCESSING of a type that may be stopped: its worker is
    told), or raise the problem that says why not. 409 NOT_CANCELLABLE: a running job whose
    effect may already be made (a GitHub commit's PUT)."""
    _check(job)
    if await lifecycle.cancel(session, [job.job_id], reason, owner_message=owner_message):
        await session.refresh(job)
        return
    # It changed between the read and the cancel: claimed, or finished.
    await session.refresh(job)
    _check(job)
    raise Conflict(f"job {job.job_id} changed meanwhile; reload and try again")
