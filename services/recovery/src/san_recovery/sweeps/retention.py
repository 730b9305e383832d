"""Retention: terminal jobs finished before their horizon are deleted, a bounded batch per
status per transaction, with their status history (cascade) and any outbox rows left.
Active jobs are never touched; the runner repeats batches until one comes back short."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.types import JobStatus
from san_recovery import repository
from san_recovery.policy import Policy
from san_recovery.tally import Outcome, Tally


async def sweep(session: AsyncSession, now: datetime, policy: Policy) -> Tally:
    tally = Tally()
    horizons = (
        (JobStatus.COMPLETED, policy.keep_completed),
        (JobStatus.FAILED, policy.keep_failed),
        (JobStatus.CANCELLED, policy.keep_failed),
    )
    for status, keep in horizons:
        pruned = await repository.prune_jobs(
            session, status=status, finished_before=now - keep, limit=policy.batch_size
        )
        for _job_id, job_type in pruned:
            tally.found(job_type)
            tally.record(job_type, Outcome.PRUNED)
        await repository.delete_outbox_of(session, [job_id for job_id, _ in pruned])
    return tally
