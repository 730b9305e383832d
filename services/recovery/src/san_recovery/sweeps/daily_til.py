"""The daily TIL batch: for each user with cards on the previous day (in the user's time
zone) and no TIL for it, create the TIL and register TIL_GENERATION; and register
RECALL_QUIZ_GENERATION (both quiz types) for that day unless the user has one already."""

from __future__ import annotations

from datetime import datetime
from functools import partial

from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.admission import Priority
from san_common.jobs.registration import DuplicateActiveJob
from san_common.jobs.types import JobType
from san_common.til import QUIZ_TYPES, TilInProgress, start_quiz_generation, start_til_generation
from san_recovery import repository
from san_recovery.policy import Policy
from san_recovery.repository import UserDay
from san_recovery.savepoint import settle
from san_recovery.tally import Outcome, Tally


async def sweep(session: AsyncSession, now: datetime, policy: Policy) -> Tally:
    tally = Tally()
    days = await repository.user_days_without_til(
        session, now=now, lookback_days=policy.til_lookback_days, limit=policy.batch_size
    )
    for day in days:
        if day.needs_til:
            tally.found(JobType.TIL_GENERATION)
            outcome = await settle(
                session,
                partial(_start_til, session, day),
                # A TIL of this user is being generated (API, other day): a later run with
                # `RECOVERY_TIL_LOOKBACK_DAYS` > 1 picks this day up again.
                skip_on=(TilInProgress, DuplicateActiveJob),
                job_type=JobType.TIL_GENERATION.value,
                user_id=day.user_id,
                target_date=day.day.isoformat(),
            )
            tally.record(JobType.TIL_GENERATION, outcome)
        if day.needs_quiz:
            tally.found(JobType.RECALL_QUIZ_GENERATION)
            outcome = await settle(
                session,
                partial(_start_quiz, session, day),
                job_type=JobType.RECALL_QUIZ_GENERATION.value,
                user_id=day.user_id,
                target_date=day.day.isoformat(),
            )
            tally.record(JobType.RECALL_QUIZ_GENERATION, outcome)
    return tally


async def _start_til(session: AsyncSession, day: UserDay) -> Outcome:
    await start_til_generation(
        session, user_id=day.user_id, target_date=day.day, priority=Priority.BATCH
    )
    return Outcome.REGISTERED


async def _start_quiz(session: AsyncSession, day: UserDay) -> Outcome:
    await start_quiz_generation(
        session,
        user_id=day.user_id,
        target_date=day.day,
        quiz_types=QUIZ_TYPES,
        priority=Priority.BATCH,
    )
    return Outcome.REGISTERED
