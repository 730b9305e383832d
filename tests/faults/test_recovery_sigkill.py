"""SIGKILL of the recovery process while it runs an operator's "run now": the request it
took is not left started and never finished. Another recovery process (a replica, or this
one restarted) takes it again once the dead one's heartbeat is `RECOVERY_REQUEST_STALE_
SECONDS` old, runs its sweeps, and finishes it — what the killed run had begun is rolled
back with its connection, so the work is done once."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.registration import lock_user
from san_common.jobs.registry import TIL_USER_LOCK
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, DailySummary
from tests.faults.harness import FaultStack, Figures, record
from tests.recovery.seed import (
    Seed,
    ask_for_sweeps,
    sweep_request,
    utcnow,
    waiting_for_an_advisory_lock,
)
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(180)]

TIL = JobType.TIL_GENERATION
ENV = {"RECOVERY_REQUEST_POLL_SECONDS": "0.2", "RECOVERY_REQUEST_STALE_SECONDS": "2"}


async def test_a_run_now_whose_recovery_process_is_killed_is_run_by_the_next(
    stack: FaultStack, db: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    seed = Seed(db, utcnow())
    user = await seed.user()
    summary = await seed.summary(user, seed.now.date() - timedelta(days=2), "FAILED")
    failed = await seed.job(TIL, summary, user, status="FAILED", error="TIL_GENERATION failed: x")
    request_id = await ask_for_sweeps(db, ["failed"])

    # A `POST /til` of the same user holds the TIL lock: the sweep's re-registration of
    # the failed TIL waits for it, so the run is in the middle when the process dies.
    async with db() as holder, holder.begin():
        await lock_user(holder, TIL_USER_LOCK, user)
        first = stack.start("recovery", **ENV)
        await eventually(
            lambda: waiting_for_an_advisory_lock(db),
            within=60,
            what="the run waiting for the user's TIL lock",
            context=lambda: stack.logs(),
        )
        first.kill()
        killed_at = time.monotonic()
    # The dead process's backend ends once it finds its client gone, rolling back what the
    # run began and releasing the sweep's lock (else the next run would find it "locked").
    await eventually(lambda: _no_advisory_locks(db), within=30, what="the dead run's locks")
    assert (await sweep_request(db, request_id)).finished_at is None  # started, never finished

    stack.start("recovery", **ENV)
    await eventually(
        lambda: _finished(db, request_id),
        within=60,
        what="the request run again",
        context=lambda: stack.logs(),
    )
    healed = time.monotonic() - killed_at

    done = await sweep_request(db, request_id)
    assert (done.attempts, done.ok, done.error) == (2, True, None)
    async with db() as session:
        tils = (
            await session.scalars(
                select(AsyncJob.job_id).where(
                    AsyncJob.user_id == user,
                    AsyncJob.job_type == TIL,
                    AsyncJob.status.in_(["PENDING", "PROCESSING"]),
                )
            )
        ).all()
        summary_status = await session.scalar(
            select(DailySummary.status).where(DailySummary.id == summary)
        )
    # re-registered once (a new job; the failed one stays as it was), by the second run
    assert len(tils) == 1 and failed not in tils
    assert summary_status == "PENDING"
    record(
        Figures(
            test="recovery SIGKILLed mid-'run now'; a second recovery process started",
            jobs=1,
            fault="SIGKILL while the run's re-registration waits on a lock; "
            f"RECOVERY_REQUEST_STALE_SECONDS={ENV['RECOVERY_REQUEST_STALE_SECONDS']}",
            completed=1,
            lost=0,
            duplicated=0,
            time_to_heal_s=round(healed, 1),
        ),
        tmp_path,
    )


async def _no_advisory_locks(db: async_sessionmaker[AsyncSession]) -> bool:
    async with db() as session:
        held = await session.scalar(
            text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        )
    return held == 0


async def _finished(db: async_sessionmaker[AsyncSession], request_id: int) -> bool:
    return (await sweep_request(db, request_id)).finished_at is not None
