"""Recovery's re-registration of a failed TIL respects the one-active-TIL-job-per-user rule
(acceptance 7 of issue 9): `register_job_in_transaction` takes the per-user TIL lock the
registry declares and refuses while the user has an active TIL_GENERATION job."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

from sqlalchemy import func, select

from san_common.jobs.registration import lock_user
from san_common.jobs.registry import TIL_USER_LOCK
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, DailySummary
from san_recovery.policy import Policy
from san_recovery.runner import RunStatus, run_sweep
from san_recovery.sweeps import Sweep
from tests.recovery.seed import Seed, waiting_for_an_advisory_lock
from tests.waiting import eventually

TIL = JobType.TIL_GENERATION


async def _active_tils(seed: Seed, user: object) -> int:
    async with seed.sessions() as session:
        return int(
            await session.scalar(
                select(func.count())
                .select_from(AsyncJob)
                .where(
                    AsyncJob.user_id == user,
                    AsyncJob.job_type == TIL,
                    AsyncJob.status.in_(["PENDING", "PROCESSING"]),
                )
            )
            or 0
        )


async def test_a_failed_til_is_not_reregistered_while_another_til_of_the_user_is_active(
    seed: Seed,
) -> None:
    user = await seed.user()
    day_a, day_b = seed.now.date() - timedelta(days=2), seed.now.date() - timedelta(days=1)
    failed_summary = await seed.summary(user, day_a, "FAILED")
    await seed.job(TIL, failed_summary, user, status="FAILED", error="TIL_GENERATION failed: x")
    active_summary = await seed.summary(user, day_b, "PROCESSING")
    active = await seed.job(TIL, active_summary, user, status="PROCESSING")

    report = await run_sweep(seed.sessions, Sweep.FAILED, now=seed.now, policy=Policy())
    assert report.status == RunStatus.DONE, report.error
    total = report.tally.total
    assert (total.found, total.registered, total.skipped) == (1, 0, 1)
    assert await _active_tils(seed, user) == 1
    assert await seed.status_of(DailySummary, failed_summary) == "FAILED"  # untouched

    # Day B's job ends: the next run re-registers day A.
    async with seed.sessions() as session, session.begin():
        job = await session.get(AsyncJob, active)
        assert job is not None
        job.status = "COMPLETED"
    report = await run_sweep(seed.sessions, Sweep.FAILED, now=seed.now, policy=Policy())
    assert report.tally.total.registered == 1
    assert await _active_tils(seed, user) == 1
    assert await seed.status_of(DailySummary, failed_summary) == "PENDING"


async def test_the_reregistration_waits_for_a_til_request_holding_the_user_lock(
    seed: Seed,
) -> None:
    """A `POST /til` holds the user's TIL lock while it checks and registers; the sweep's
    re-registration waits for it and then sees its job (no two active TIL jobs)."""
    user = await seed.user()
    failed_summary = await seed.summary(user, seed.now.date() - timedelta(days=2), "FAILED")
    await seed.job(TIL, failed_summary, user, status="FAILED", error="TIL_GENERATION failed: x")
    other_summary = await seed.summary(user, seed.now.date() - timedelta(days=1), "PENDING")

    async with seed.sessions() as request, request.begin():
        await lock_user(request, TIL_USER_LOCK, user)
        sweeping = asyncio.create_task(
            run_sweep(seed.sessions, Sweep.FAILED, now=seed.now, policy=Policy())
        )

        await eventually(
            lambda: waiting_for_an_advisory_lock(seed.sessions),
            within=30,
            what="the sweep to wait",
        )
        request.add(
            AsyncJob(
                job_id=uuid.uuid4(),
                job_type=TIL.value,
                target_id=other_summary,
                user_id=user,
                attempt=1,
            )
        )
        await request.flush()
        assert not sweeping.done()
    report = await asyncio.wait_for(sweeping, 30)
    assert report.status == RunStatus.DONE, report.error
    assert report.tally.total.registered == 0
    assert await _active_tils(seed, user) == 1
