"""Acceptance 5: retention deletes exactly the terminal jobs past their horizon (with their
status history and outbox rows), in bounded batches, and leaves active jobs and recent rows
alone. Timestamps are seeded; nothing sleeps. Also: sweep history and operators' requests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.models import AsyncJob, AsyncJobEvent, OutboxMessage, SweepRequest, SweepRun
from san_common.models.operations import SWEEP_NAMES
from san_recovery.policy import Policy
from san_recovery.runner import RunStatus, run_requested, run_sweep
from san_recovery.sweeps import Sweep
from tests.admin.support import insert_jobs, new_user

Sessions = async_sessionmaker[AsyncSession]
POLICY = Policy(batch_size=10, keep_completed=timedelta(days=14), keep_failed=timedelta(days=30))
NOW = datetime.now(UTC)
STALE = timedelta(minutes=1)  # an operator's request nobody beat for this long is taken again


def days_ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


async def jobs_by_id(db: Sessions) -> set[uuid.UUID]:
    async with db() as session:
        return set((await session.scalars(select(AsyncJob.job_id))).all())


async def test_retention_deletes_exactly_the_rows_past_the_horizon(db: Sessions) -> None:
    user_id, _ = await new_user(db)
    old = days_ago(40)

    async def seed(count: int, status: str, finished_days_ago: float) -> list[uuid.UUID]:
        finished = days_ago(finished_days_ago)
        return await insert_jobs(
            db, user_id, count, status=status, created_at=old, finished_at=finished
        )

    doomed = [
        *await seed(25, "COMPLETED", 15),
        *await seed(12, "FAILED", 31),
        *await seed(4, "CANCELLED", 31),
    ]
    kept = [
        *await seed(5, "COMPLETED", 13),
        *await seed(3, "FAILED", 20),
        *await seed(2, "CANCELLED", 29),
        # active jobs are never pruned, however old
        *await seed(3, "PENDING", 99),
        *await seed(2, "PROCESSING", 99),
    ]
    async with db() as session, session.begin():
        await session.execute(
            insert(OutboxMessage),
            [
                {"message_id": uuid.uuid4(), "exchange": "jobs", "routing_key": "CARD_ANALYSIS",
                 "body": {"job_id": str(job_id)}}
                for job_id in (doomed[0], kept[0])
            ],
        )  # fmt: skip

    report = await run_sweep(db, Sweep.RETENTION, now=NOW, policy=POLICY)

    assert report.status is RunStatus.DONE and report.ok
    assert report.tally.total.pruned == 41
    assert report.batches >= 3  # bounded: at most 10 rows per status per transaction
    assert await jobs_by_id(db) == set(kept)
    async with db() as session:
        events = await session.scalar(
            select(func.count()).select_from(AsyncJobEvent).where(AsyncJobEvent.job_id.in_(doomed))
        )
        outbox = (await session.scalars(select(OutboxMessage.body))).all()
    assert events == 0  # history went with the job (the insert trigger had logged one each)
    assert [b["job_id"] for b in outbox] == [str(kept[0])]

    again = await run_sweep(db, Sweep.RETENTION, now=NOW, policy=POLICY)
    assert again.tally.total.pruned == 0 and again.batches == 1


async def test_runs_are_recorded_and_operator_requests_run(db: Sessions) -> None:
    async with db() as session, session.begin():
        session.add(SweepRequest(sweeps=["retention", "ghost"], requested_by="op-a"))
    request_id = await run_requested(db, policy=POLICY, stale_after=STALE)
    assert request_id is not None
    assert await run_requested(db, policy=POLICY, stale_after=STALE) is None  # nothing left to do
    async with db() as session:
        runs = (await session.scalars(select(SweepRun).order_by(SweepRun.id))).all()
        request = await session.get(SweepRequest, request_id)
    assert [(r.sweep, r.trigger, r.request_id) for r in runs] == [
        ("ghost", "operator", request_id),  # canonical order, whatever the request's
        ("retention", "operator", request_id),
    ]
    assert all(r.status == "done" and "pruned" in r.totals for r in runs)
    assert request is not None and request.finished_at is not None and request.ok is True


def test_the_api_names_every_sweep_recovery_knows() -> None:
    assert set(SWEEP_NAMES) == {s.value for s in Sweep}
