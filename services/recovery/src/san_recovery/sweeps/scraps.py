"""Orphan scraps (no knowledge card) and unrefined scraps (no refined content) with no
job of the matching type on its way → register one (docs/reference/job-rules.md §2.7)."""

from __future__ import annotations

from datetime import datetime
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.registration import (
    DuplicateActiveJob,
    Priority,
    register_job_in_transaction,
)
from san_common.jobs.types import JobType
from san_recovery import repository
from san_recovery.policy import Policy
from san_recovery.repository import ScrapCandidate
from san_recovery.savepoint import settle
from san_recovery.tally import Outcome, Tally


async def sweep_orphans(session: AsyncSession, now: datetime, policy: Policy) -> Tally:
    return await _sweep(session, JobType.CARD_ANALYSIS, now, policy)


async def sweep_unrefined(session: AsyncSession, now: datetime, policy: Policy) -> Tally:
    return await _sweep(session, JobType.SCRAP_REFINE, now, policy)


async def _sweep(session: AsyncSession, job_type: JobType, now: datetime, policy: Policy) -> Tally:
    tally = Tally()
    candidates = await repository.scraps_missing(
        session,
        job_type,
        created_before=now - policy.orphan_grace,
        max_attempt=policy.max_attempt,
        limit=policy.batch_size,
    )
    for scrap in candidates:
        tally.found(job_type)
        outcome = await settle(
            session,
            partial(_register, session, job_type, scrap),
            skip_on=(DuplicateActiveJob,),
            scrap_id=scrap.scrap_id,
            job_type=job_type.value,
        )
        tally.record(job_type, outcome)
    return tally


async def _register(session: AsyncSession, job_type: JobType, scrap: ScrapCandidate) -> Outcome:
    await register_job_in_transaction(
        session,
        job_type=job_type,
        target_id=scrap.scrap_id,
        user_id=scrap.user_id,
        attempt=scrap.attempt,
        priority=Priority.BATCH,  # nobody is waiting on a sweep: after their work
    )
    return Outcome.REGISTERED
