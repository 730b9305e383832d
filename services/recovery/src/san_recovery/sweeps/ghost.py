"""Ghost jobs: PENDING too long (the message was lost) or PROCESSING too long / past its
lease (the worker died or hangs) → FAILED with a "ghost job: …" message, then re-registered."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.types import JobStatus
from san_recovery import repository
from san_recovery.policy import Policy
from san_recovery.repository import JobRow
from san_recovery.reregister import retry_or_give_up
from san_recovery.savepoint import settle
from san_recovery.tally import Tally


async def sweep(session: AsyncSession, now: datetime, policy: Policy) -> Tally:
    tally = Tally()
    jobs = await repository.ghost_candidates(
        session,
        pending_before=now - policy.pending_after,
        started_before=now - policy.processing_after,
        lease_expired_before=now - policy.lease_grace,
        limit=policy.batch_size,
    )
    for job in jobs:
        tally.found(job.job_type)
        reason = ghost_reason(job, now, policy)
        outcome = await settle(
            session,
            partial(retry_or_give_up, session, job, policy, ghost=reason),
            job_id=job.job_id,
            job_type=job.job_type,
        )
        tally.record(job.job_type, outcome)
    return tally


def ghost_reason(job: JobRow, now: datetime, policy: Policy) -> str:
    if job.status == JobStatus.PENDING.value:
        return f"ghost job: pending for {_span(now - job.updated_at)} (message lost)"
    started = job.started_at or job.updated_at
    worker = job.worker_id or "unknown"
    if job.lease_expires_at is not None and job.lease_expires_at < now - policy.lease_grace:
        return (
            f"ghost job: worker {worker} died "
            f"(lease expired {_span(now - job.lease_expires_at)} ago, "
            f"processing for {_span(now - started)})"
        )
    return (
        f"ghost job: worker {worker} died or hangs "
        f"(processing for {_span(now - started)}, limit {_span(policy.processing_after)})"
    )


def _span(delta: timedelta) -> str:
    minutes = max(0, int(delta.total_seconds() // 60))
    if minutes < 60:
        return f"{minutes} min" if minutes else f"{max(0, int(delta.total_seconds()))} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"
