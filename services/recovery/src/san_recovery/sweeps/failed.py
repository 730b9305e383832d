"""Failed jobs: the newest job of a (target, type) is FAILED → re-register it while the
chain has re-registrations left; otherwise mark it given up (once) and leave it FAILED."""

from __future__ import annotations

from datetime import datetime
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession

from san_recovery import repository
from san_recovery.policy import Policy
from san_recovery.reregister import retry_or_give_up
from san_recovery.savepoint import settle
from san_recovery.tally import Tally


async def sweep(session: AsyncSession, now: datetime, policy: Policy) -> Tally:
    tally = Tally()
    for job in await repository.failed_candidates(session, limit=policy.batch_size):
        tally.found(job.job_type)
        outcome = await settle(
            session,
            partial(retry_or_give_up, session, job, policy),
            job_id=job.job_id,
            job_type=job.job_type,
        )
        tally.record(job.job_type, outcome)
    return tally
