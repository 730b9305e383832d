"""The lease machinery, fast: the executor and the job repository on real PostgreSQL with
an in-memory delivery (no broker). Each test here is the catching test of a mutation in
`tests/faults/mutations.py`: fencing, `complete()`'s result, the expired-lease takeover,
the rescuer, the heartbeat, a finished job claimed again, the envelope version."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs import lifecycle as jobs
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, OutboxMessage
from san_common.worker.executor import Executor, Outcome, RuntimeConfig
from san_common.worker.store import SqlJobStore
from tests.faults.harness import seed, try_rows
from tests.waiting import eventually

LEASE = timedelta(seconds=30)


@dataclass
class MemoryDelivery:
    """A delivery as the executor sees one, without a broker."""

    body: bytes
    headers: Mapping[str, Any] = field(default_factory=dict)
    delivery_count: int = 0
    settled: list[str] = field(default_factory=list)

    async def ack(self) -> None:
        self.settled.append("ack")

    async def requeue(self) -> None:
        self.settled.append("requeue")

    async def dead_letter(self, kind: str, reason: str) -> None:
        self.settled.append(f"dead_letter: {kind}: {reason}")


class RefineHandler:
    """SCRAP_REFINE without an AI: `run` answers `answer` (after `release`, if given);
    `store` writes it to the scrap, the way the real handler writes its result."""

    job_type: ClassVar[str] = JobType.SCRAP_REFINE

    def __init__(self, answer: str, release: asyncio.Event | None = None) -> None:
        self.answer = answer
        self.release = release
        self.running = asyncio.Event()
        self.runs = 0

    async def load(self, session: AsyncSession, job: AsyncJob) -> None:
        return None

    async def run(self, job: AsyncJob, payload: None) -> str:
        self.runs += 1
        self.running.set()
        if self.release is not None:
            await self.release.wait()
        return self.answer

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        await session.execute(
            text("UPDATE scraps SET refined_content = :r WHERE id = :id"),
            {"r": result, "id": job.target_id},
        )


@pytest.fixture
def sessions(fresh_sessions: async_sessionmaker[AsyncSession]) -> async_sessionmaker[AsyncSession]:
    """This module's tests each on a database of their own."""
    return fresh_sessions


@dataclass(frozen=True)
class Job:
    job_id: uuid.UUID
    scrap_id: uuid.UUID
    body: bytes


async def _job(sessions: async_sessionmaker[AsyncSession]) -> Job:
    seeded = await seed(sessions, 1, [JobType.SCRAP_REFINE], label="lease")
    job_id = seeded.job_ids[0]
    async with sessions() as session:
        body = await session.scalar(
            select(OutboxMessage.body).where(OutboxMessage.body["job_id"].astext == str(job_id))
        )
    return Job(job_id, seeded.scrap_ids[0], json.dumps(body).encode())


def _executor(
    sessions: async_sessionmaker[AsyncSession],
    handler: RefineHandler,
    worker_id: str,
    **config: Any,
) -> Executor:
    return Executor(
        store=SqlJobStore(sessions),
        handlers={JobType.SCRAP_REFINE: handler},
        config=RuntimeConfig(**{"lease_seconds": 30.0, **config}),
        worker_id=worker_id,
    )


async def _row(sessions: async_sessionmaker[AsyncSession], job_id: uuid.UUID) -> AsyncJob:
    async with sessions() as session:
        job = await session.get(AsyncJob, job_id)
    assert job is not None
    return job


async def _refined(sessions: async_sessionmaker[AsyncSession], scrap_id: uuid.UUID) -> str | None:
    async with sessions() as session:
        return await session.scalar(
            text("SELECT refined_content FROM scraps WHERE id = :id"), {"id": scrap_id}
        )


async def _expire(sessions: async_sessionmaker[AsyncSession], job_id: uuid.UUID) -> None:
    """The lease runs out (its worker stopped renewing it)."""
    async with sessions() as session, session.begin():
        await session.execute(
            update(AsyncJob)
            .where(AsyncJob.job_id == job_id)
            .values(lease_expires_at=func.now() - timedelta(seconds=1))
        )


async def _claim(
    sessions: async_sessionmaker[AsyncSession], job_id: uuid.UUID, worker_id: str
) -> AsyncJob | None:
    async with sessions() as session, session.begin():
        return await jobs.claim(session, job_id, worker_id, LEASE)


# -- fencing ---------------------------------------------------------------------------------


async def test_a_taken_over_try_changes_nothing_with_any_of_its_writes(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    job = await _job(sessions)
    first = await _claim(sessions, job.job_id, "w-first")
    assert first is not None and first.tries == 1
    await _expire(sessions, job.job_id)
    second = await _claim(sessions, job.job_id, "w-second")
    assert second is not None and second.tries == 2, "an expired lease must be taken over"
    before = await _row(sessions, job.job_id)

    async with sessions() as session, session.begin():
        assert not await jobs.extend_lease(session, job.job_id, 1, LEASE)
        assert not await jobs.complete(session, job.job_id, 1)
        assert not await jobs.fail(session, job.job_id, 1, "late failure", "late")
        assert not await jobs.release(session, job.job_id, 1)
        retried = await jobs.retry_later(
            session, job.job_id, 1, delay=timedelta(seconds=1), error="late", summary="late"
        )
        assert retried is None

    after = await _row(sessions, job.job_id)
    assert (after.status, after.tries, after.worker_id) == ("PROCESSING", 2, "w-second")
    assert after.lease_expires_at == before.lease_expires_at
    async with sessions() as session, session.begin():
        assert await jobs.complete(session, job.job_id, 2)
    outcomes = {r["try_no"]: r["outcome"] for r in await try_rows(sessions, [job.job_id])}
    assert outcomes == {1: "lease_lost", 2: "completed"}


async def test_a_late_result_is_rolled_back_and_the_new_try_keeps_the_job(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The executor's own path: its try is taken over while `run` is out; the late
    `store` + `complete` transaction changes nothing, the delivery is acked."""
    job = await _job(sessions)
    release = asyncio.Event()
    late = RefineHandler("late answer", release)
    delivery = MemoryDelivery(job.body)
    running = asyncio.create_task(_executor(sessions, late, "w-late").handle(delivery))
    await asyncio.wait_for(late.running.wait(), 10)

    await _expire(sessions, job.job_id)
    taken = await _claim(sessions, job.job_id, "w-new")
    assert taken is not None and taken.tries == 2
    release.set()
    assert await asyncio.wait_for(running, 10) == Outcome.LEASE_LOST
    assert delivery.settled == ["ack"]
    assert await _refined(sessions, job.scrap_id) is None, "the late store was committed"
    row = await _row(sessions, job.job_id)
    assert (row.status, row.tries, row.worker_id) == ("PROCESSING", 2, "w-new")


# -- taking over -----------------------------------------------------------------------------


async def test_a_live_lease_is_not_taken_over_and_its_delivery_comes_back_later(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    job = await _job(sessions)
    assert await _claim(sessions, job.job_id, "w-holder") is not None
    assert await _claim(sessions, job.job_id, "w-other") is None
    delivery = MemoryDelivery(job.body)
    handler = RefineHandler("never")
    outcome = await _executor(sessions, handler, "w-other").handle(delivery)
    assert outcome == Outcome.DEFERRED and handler.runs == 0
    async with sessions() as session:
        due = await session.scalar(
            select(func.count())
            .select_from(OutboxMessage)
            .where(
                OutboxMessage.body["job_id"].astext == str(job.job_id),
                OutboxMessage.available_at > func.now(),
            )
        )
    assert due == 1, "the deferred delivery needs a message due when the lease runs out"


async def test_the_rescuer_makes_expired_jobs_claimable_under_the_same_id(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    live, dead = await _job(sessions), await _job(sessions)
    assert await _claim(sessions, live.job_id, "w-live") is not None
    assert await _claim(sessions, dead.job_id, "w-dead") is not None
    await _expire(sessions, dead.job_id)
    async with sessions() as session, session.begin():
        rescued = await jobs.rescue_expired(session, limit=100)
    assert [r.job_id for r in rescued] == [dead.job_id]
    row = await _row(sessions, dead.job_id)
    assert (row.status, row.worker_id) == ("PENDING", None)
    async with sessions() as session:
        messages = await session.scalar(
            select(func.count())
            .select_from(OutboxMessage)
            .where(OutboxMessage.body["job_id"].astext == str(dead.job_id))
        )
    assert messages == 2, "a rescued job needs a new message"
    again = await _claim(sessions, dead.job_id, "w-next")
    assert again is not None and again.job_id == dead.job_id and again.tries == 2
    assert (await _row(sessions, live.job_id)).worker_id == "w-live"


# -- the heartbeat ---------------------------------------------------------------------------


async def test_the_heartbeat_keeps_a_long_job_s_lease(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A job that runs for several lease lengths keeps its lease, is never rescued, and
    completes in its first try."""
    job = await _job(sessions)
    release = asyncio.Event()
    handler = RefineHandler("slow answer", release)
    executor = _executor(sessions, handler, "w-slow", lease_seconds=1.5)
    running = asyncio.create_task(executor.handle(MemoryDelivery(job.body)))
    await asyncio.wait_for(handler.running.wait(), 10)
    first_expiry = (await _row(sessions, job.job_id)).lease_expires_at
    assert first_expiry is not None
    renewals = 0

    async def renewed_twice() -> bool:
        nonlocal first_expiry, renewals
        async with sessions() as session, session.begin():
            assert not await jobs.rescue_expired(session, limit=10), "the lease ran out"
        expiry = (await _row(sessions, job.job_id)).lease_expires_at
        assert expiry is not None
        if expiry > first_expiry:
            renewals, first_expiry = renewals + 1, expiry
        return renewals >= 2

    try:
        await eventually(renewed_twice, within=20, what="the heartbeat renewing the lease twice")
    finally:
        release.set()
    assert await asyncio.wait_for(running, 10) == Outcome.COMPLETED
    row = await _row(sessions, job.job_id)
    assert (row.status, row.tries) == ("COMPLETED", 1)


# -- finished jobs and foreign messages ------------------------------------------------------


async def test_a_duplicate_delivered_after_completion_is_skipped(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    job = await _job(sessions)
    handler = RefineHandler("first answer")
    executor = _executor(sessions, handler, "w-1")
    assert await executor.handle(MemoryDelivery(job.body)) == Outcome.COMPLETED
    completed = await _row(sessions, job.job_id)
    # The same message again, after the first delivery completed (a relay that crashed
    # between confirm and mark publishes it twice), to another worker and to this one.
    handler.answer = "second answer"
    for worker in (_executor(sessions, handler, "w-2"), executor):
        duplicate = MemoryDelivery(job.body, delivery_count=1)
        assert await worker.handle(duplicate) == Outcome.SKIPPED
        assert duplicate.settled == ["ack"]
    assert handler.runs == 1
    assert await _refined(sessions, job.scrap_id) == "first answer"
    row = await _row(sessions, job.job_id)
    assert (row.status, row.tries, row.finished_at) == ("COMPLETED", 1, completed.finished_at)


async def test_an_envelope_of_an_unknown_version_is_dead_lettered_and_not_run(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    job = await _job(sessions)
    body = json.loads(job.body)
    body["version"] = 99
    handler = RefineHandler("never")
    delivery = MemoryDelivery(json.dumps(body).encode())
    outcome = await _executor(sessions, handler, "w-1").handle(delivery)
    assert outcome == Outcome.DEAD_LETTERED and handler.runs == 0
    assert len(delivery.settled) == 1 and delivery.settled[0].startswith("dead_letter: ")
    assert "version 99" in delivery.settled[0]
    row = await _row(sessions, job.job_id)
    assert (row.status, row.tries) == ("PENDING", 0)
