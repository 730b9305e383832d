"""The job lifecycle (`san_common.jobs.lifecycle`, issue 35 acceptance 6): every row of
its transition table is driven by a test through the real function, against PostgreSQL,
and leaves the job in its to-status, its tries closed (but the running one), the job
event logged and the target row's mirrored status moved. The database holds the same
table and refuses any other status change, even as raw SQL."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import date, timedelta

import pytest
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs import lifecycle
from san_common.jobs.lifecycle import TRANSITIONS, Event, Transition, TryOutcome
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobStatus, JobType
from san_common.models import (
    AsyncJob,
    AsyncJobEvent,
    AsyncJobTransition,
    AsyncJobTry,
    DailySummary,
    User,
)

Sessions = async_sessionmaker[AsyncSession]
LEASE = timedelta(seconds=30)
P, R, C, F, X = (
    JobStatus.PENDING,
    JobStatus.PROCESSING,
    JobStatus.COMPLETED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
)
# The mirrored status of the target row after each to-status: an operator's cancel tells
# the target's owner it failed (the target tables know no CANCELLED).
MIRRORED = {P: "PENDING", R: "PROCESSING", C: "COMPLETED", F: "FAILED", X: "FAILED"}


@pytest.fixture
async def db(fresh_db_url: str) -> AsyncIterator[Sessions]:
    engine = create_engine(fresh_db_url, pool_size=4)
    yield create_session_factory(engine)
    await engine.dispose()


@dataclass(frozen=True)
class Job:
    job_id: uuid.UUID
    summary_id: uuid.UUID


async def _new_job(db: Sessions) -> Job:
    """A TIL_GENERATION job (its target row, a daily summary, mirrors its status)."""
    async with db() as session, session.begin():
        user_id = await session.scalar(
            insert(User).values(external_id=f"lc-{uuid.uuid4().hex}").returning(User.id)
        )
        summary_id = await session.scalar(
            insert(DailySummary)
            .values(user_id=user_id, target_date=date(2024, 1, 5))
            .returning(DailySummary.id)
        )
    assert user_id is not None and summary_id is not None
    job = await register_job(
        db, job_type=JobType.TIL_GENERATION, target_id=summary_id, user_id=user_id
    )
    return Job(job.job_id, summary_id)


async def _claim(db: Sessions, job: Job, worker: str = "w-lc") -> int:
    async with db() as session, session.begin():
        claimed = await lifecycle.claim(session, job.job_id, worker, LEASE)
    assert claimed is not None
    return claimed.tries


async def _expire(db: Sessions, job: Job) -> None:
    async with db() as session, session.begin():  # its worker vanished: the lease ran out
        await session.execute(
            update(AsyncJob)
            .where(AsyncJob.job_id == job.job_id)
            .values(lease_expires_at=func.now() - timedelta(seconds=1))
        )


async def _failed(db: Sessions, job: Job) -> None:
    try_no = await _claim(db, job)
    async with db() as session, session.begin():
        assert await lifecycle.fail(session, job.job_id, try_no, "x failed: y", "failed")


# One scenario per row of the table: it brings a new job to the row's from-status the way
# the system does, then makes the row's event happen.
Scenario = Callable[[Sessions, Job], Awaitable[None]]


async def _claim_it(db: Sessions, job: Job) -> None:
    await _claim(db, job)


async def _take_over(db: Sessions, job: Job) -> None:
    await _claim(db, job, "w-lost")
    await _expire(db, job)
    await _claim(db, job, "w-next")


async def _complete(db: Sessions, job: Job) -> None:
    try_no = await _claim(db, job)
    async with db() as session, session.begin():
        assert await lifecycle.complete(session, job.job_id, try_no)


async def _retry_later(db: Sessions, job: Job) -> None:
    try_no = await _claim(db, job)
    async with db() as session, session.begin():
        at = await lifecycle.retry_later(
            session, job.job_id, try_no, delay=timedelta(0), error="e", summary="s"
        )
    assert at is not None


async def _release(db: Sessions, job: Job) -> None:
    try_no = await _claim(db, job)
    async with db() as session, session.begin():
        assert await lifecycle.release(session, job.job_id, try_no, "released on shutdown")


async def _rescue(db: Sessions, job: Job) -> None:
    await _claim(db, job)
    await _expire(db, job)
    async with db() as session, session.begin():
        rescued = await lifecycle.rescue_expired(session, limit=10)
    assert [(r.job_id, r.spent) for r in rescued] == [(job.job_id, 1)]


def _revive(from_status: JobStatus) -> Scenario:
    async def scenario(db: Sessions, job: Job) -> None:
        if from_status == R:
            await _claim(db, job)
        async with db() as session, session.begin():
            assert await lifecycle.revive(
                session, job.job_id, from_status=from_status, reason="ghost job: lost"
            )

    return scenario


def _give_up(from_status: JobStatus) -> Scenario:
    async def scenario(db: Sessions, job: Job) -> None:
        if from_status == R:
            await _claim(db, job)
        elif from_status == F:
            await _failed(db, job)
        async with db() as session, session.begin():
            assert await lifecycle.give_up(
                session,
                job.job_id,
                from_status=from_status,
                message="recovery gave up: ghost job: worker host-1 died",
                owner_message="recovery gave up: its worker was lost",
            )

    return scenario


async def _retry(db: Sessions, job: Job) -> None:
    await _failed(db, job)
    async with db() as session, session.begin():
        assert await lifecycle.retry(session, [job.job_id]) == [job.job_id]


async def _cancel(db: Sessions, job: Job) -> None:
    async with db() as session, session.begin():
        assert await lifecycle.cancel(session, [job.job_id], "cancelled by operator o") == 1


async def _cancel_running(db: Sessions, job: Job) -> None:
    try_no = await _claim(db, job)
    async with db() as session, session.begin():
        assert await lifecycle.cancel(session, [job.job_id], "cancelled by its owner") == 1
    async with db() as session, session.begin():
        # the worker's try no longer holds the job: what it writes later changes nothing
        assert not await lifecycle.complete(session, job.job_id, try_no)
        assert not await lifecycle.fail(session, job.job_id, try_no, "late", "late")
        outcome = await session.scalar(
            select(AsyncJobTry.outcome).where(
                AsyncJobTry.job_id == job.job_id, AsyncJobTry.try_no == try_no
            )
        )
    assert outcome == TryOutcome.CANCELLED


async def _fail(db: Sessions, job: Job) -> None:
    await _failed(db, job)


SCENARIOS: dict[tuple[JobStatus, Event], Scenario] = {
    (P, Event.CLAIM): _claim_it,
    (R, Event.TAKE_OVER): _take_over,
    (R, Event.COMPLETE): _complete,
    (R, Event.FAIL): _fail,
    (R, Event.RETRY_LATER): _retry_later,
    (R, Event.RELEASE): _release,
    (R, Event.RESCUE): _rescue,
    (P, Event.REVIVE): _revive(P),
    (R, Event.REVIVE): _revive(R),
    (P, Event.GIVE_UP): _give_up(P),
    (R, Event.GIVE_UP): _give_up(R),
    (F, Event.GIVE_UP): _give_up(F),
    (F, Event.RETRY): _retry,
    (P, Event.CANCEL): _cancel,
    (R, Event.CANCEL_RUNNING): _cancel_running,
}


@pytest.mark.parametrize(
    "transition", TRANSITIONS, ids=lambda t: f"{t.from_status}-{t.event}-{t.to_status}"
)
async def test_every_transition_moves_the_job_its_try_its_event_and_its_mirror(
    db: Sessions, transition: Transition
) -> None:
    scenario = SCENARIOS.get((transition.from_status, transition.event))
    assert scenario is not None, f"no test drives {transition}"
    job = await _new_job(db)
    await scenario(db, job)
    to = transition.to_status
    async with db() as session:
        status = await session.scalar(select(AsyncJob.status).where(AsyncJob.job_id == job.job_id))
        tries = (
            await session.scalars(
                select(AsyncJobTry)
                .where(AsyncJobTry.job_id == job.job_id)
                .order_by(AsyncJobTry.try_no)
            )
        ).all()
        events = (
            await session.scalars(
                select(AsyncJobEvent.status)
                .where(AsyncJobEvent.job_id == job.job_id)
                .order_by(AsyncJobEvent.id)
            )
        ).all()
        mirrored = await session.scalar(
            select(DailySummary.status).where(DailySummary.id == job.summary_id)
        )
    assert status == to
    open_tries = [t.try_no for t in tries if t.outcome is None]
    # Only a running try is open: every transition out of PROCESSING closed its try.
    assert open_tries == ([tries[-1].try_no] if to == R else [])
    assert all(t.finished_at is not None for t in tries if t.outcome is not None)
    assert events[-1] == to, events
    assert mirrored == MIRRORED[to]


async def test_the_tries_a_transition_ends_carry_its_outcome(db: Sessions) -> None:
    """The outcome each event writes on the try it ends (the retry budget counts them)."""
    job = await _new_job(db)
    await _take_over(db, job)  # try 1 lost, try 2 runs
    async with db() as session, session.begin():
        assert await lifecycle.revive(session, job.job_id, from_status=R, reason="ghost job: hangs")
    try_no = await _claim(db, job)
    async with db() as session, session.begin():
        await lifecycle.retry_later(
            session,
            job.job_id,
            try_no,
            delay=timedelta(0),
            error="429",
            summary="s",
            outcome=TryOutcome.RATE_LIMITED,
        )
    try_no = await _claim(db, job)
    async with db() as session, session.begin():
        assert await lifecycle.give_up(
            session,
            job.job_id,
            from_status=R,
            message="recovery gave up (after 3 attempts)",
            owner_message="recovery gave up",
        )
    async with db() as session:
        tries = (
            await session.execute(
                select(AsyncJobTry.try_no, AsyncJobTry.outcome, AsyncJobTry.error)
                .where(AsyncJobTry.job_id == job.job_id)
                .order_by(AsyncJobTry.try_no)
            )
        ).all()
    assert [tuple(t) for t in tries] == [
        (1, "lease_lost", "taken over"),
        (2, "lease_lost", "ghost job: hangs"),
        (3, "rate_limited", "429"),
        (4, "lease_lost", "recovery gave up (after 3 attempts)"),
    ]


async def test_the_database_holds_the_declared_transitions(db: Sessions) -> None:
    async with db() as session:
        rows = (
            await session.execute(
                select(
                    AsyncJobTransition.from_status,
                    AsyncJobTransition.event,
                    AsyncJobTransition.to_status,
                )
            )
        ).all()
    assert {tuple(r) for r in rows} == {
        (t.from_status.value, t.event.value, t.to_status.value) for t in TRANSITIONS
    }


_UNDECLARED = sorted(
    (a.value, b.value)
    for a, b in itertools.permutations(JobStatus, 2)
    if (a.value, b.value) not in lifecycle.allowed_changes()
)


@pytest.mark.parametrize("change", _UNDECLARED, ids="-".join)
async def test_an_undeclared_transition_written_as_raw_sql_is_refused(
    db: Sessions, change: tuple[str, str]
) -> None:
    from_status, to_status = change
    job_id = uuid.uuid4()
    async with db() as session, session.begin():  # inserts are not checked: a fixture row
        await session.execute(
            insert(AsyncJob).values(
                job_id=job_id,
                job_type=JobType.SCRAP_REFINE.value,
                target_id=uuid.uuid4(),
                user_id=uuid.uuid4(),
                status=from_status,
            )
        )
    with pytest.raises(IntegrityError, match="not a transition of the job lifecycle"):
        async with db() as session, session.begin():
            await session.execute(
                text("UPDATE async_jobs SET status = :to WHERE job_id = :id"),
                {"to": to_status, "id": job_id},
            )
    async with db() as session:
        assert (
            await session.scalar(select(AsyncJob.status).where(AsyncJob.job_id == job_id))
            == from_status
        )


async def test_a_batch_with_one_undeclared_change_is_refused_whole(db: Sessions) -> None:
    """The check reads the whole statement: one bad row undoes the good ones beside it."""
    good, bad = await _new_job(db), await _new_job(db)
    await _claim(db, bad)
    await _complete_raw_refused(db, good, bad)
    async with db() as session:
        statuses = dict(
            (
                await session.execute(
                    select(AsyncJob.job_id, AsyncJob.status).where(
                        AsyncJob.job_id.in_([good.job_id, bad.job_id])
                    )
                )
            ).all()
        )
    assert statuses == {good.job_id: "PENDING", bad.job_id: "PROCESSING"}


async def test_the_check_of_a_large_batch_stays_linear(db: Sessions) -> None:
    """A statement over ten thousand rows is checked in one pass: the check's join is not
    a nested loop over the two transition tables (quadratic: seconds at this size)."""
    rows, user_id = 10_000, uuid.uuid4()
    async with db() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO async_jobs (job_id, job_type, target_id, user_id) "
                "SELECT gen_random_uuid(), :type, gen_random_uuid(), :user "
                "FROM generate_series(1, :rows)"
            ),
            {"type": JobType.SCRAP_REFINE.value, "rows": rows, "user": user_id},
        )
    async with db() as session, session.begin():
        started = time.perf_counter()
        changed = await session.execute(
            text("UPDATE async_jobs SET status = 'CANCELLED' WHERE user_id = :user"),
            {"user": user_id},
        )
        took = time.perf_counter() - started
    assert changed.rowcount == rows
    assert took < 2.0, f"{rows} status changes took {took:.2f} s to check"


async def _complete_raw_refused(db: Sessions, pending: Job, processing: Job) -> None:
    with pytest.raises(IntegrityError, match=f"job {pending.job_id} cannot go from PENDING"):
        async with db() as session, session.begin():
            await session.execute(
                text("UPDATE async_jobs SET status = 'COMPLETED' WHERE job_id IN (:a, :b)"),
                {"a": pending.job_id, "b": processing.job_id},
            )
