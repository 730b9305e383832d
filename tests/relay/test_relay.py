"""The relay against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from san_common.models import OutboxMessage
from tests.relay.conftest import drain_queue, make_relay, register_many, unpublished

pytestmark = pytest.mark.rabbit


async def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _queue_messages(
    amqp_url: str, queue: str, expected: int, timeout: float = 20
) -> list[dict]:  # type: ignore[type-arg]
    seen: list[dict] = []  # type: ignore[type-arg]
    deadline = asyncio.get_running_loop().time() + timeout
    while len(seen) < expected and asyncio.get_running_loop().time() < deadline:
        seen += await drain_queue(amqp_url, queue)
        await asyncio.sleep(0.05)
    return seen


async def test_publishes_registered_jobs_and_marks_rows(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    job_ids = await register_many(fresh_sessions, 25)
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await _wait_for(lambda: _zero(fresh_sessions), 20, "outbox drained")
        bodies = await _queue_messages(amqp_url, topology.queue_name(JobType.CARD_ANALYSIS), 25)
    finally:
        stop.set()
        await task
    assert {b["job_id"] for b in bodies} == {str(j) for j in job_ids}
    assert len(bodies) == 25
    sample = bodies[0]
    for key in (
        "message_id",
        "job_id",
        "job_type",
        "target_id",
        "user_id",
        "attempt",
        "created_at",
    ):
        assert key in sample


async def _zero(sessions: async_sessionmaker[AsyncSession]) -> bool:
    return await unpublished(sessions) == 0


async def test_wakes_on_notify_without_waiting_for_the_poll(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    # A poll interval far longer than the test: only LISTEN/NOTIFY can publish in time.
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions, relay_poll_seconds=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await asyncio.wait_for(relay.ready.wait(), 20)
        await asyncio.sleep(0.2)  # let the relay finish its first (empty) round and sleep
        await register_many(fresh_sessions, 3)
        await _wait_for(lambda: _zero(fresh_sessions), 5, "notify-driven publish")
    finally:
        stop.set()
        await task


async def test_two_relays_publish_every_row_exactly_once(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    total = 600
    relays = [
        make_relay(fresh_db_url, amqp_url, topology, fresh_sessions, relay_batch_size=50)
        for _ in range(2)
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run(stop)) for r in relays]
    try:
        job_ids: set = set()  # type: ignore[type-arg]
        for _ in range(6):  # rows keep arriving while both relays run
            job_ids |= await register_many(fresh_sessions, total // 6)
        await _wait_for(lambda: _zero(fresh_sessions), 60, "outbox drained by two relays")
        bodies = await _queue_messages(amqp_url, topology.queue_name(JobType.CARD_ANALYSIS), total)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    published = [b["job_id"] for b in bodies]
    assert len(published) == total, "a row was lost or published twice"
    assert set(published) == {str(j) for j in job_ids}


async def test_unconfirmed_publish_leaves_rows_for_the_next_round(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Outbox rows naming an exchange that does not exist are never confirmed: they stay
    unpublished (and are retried), while the good rows of the same batch go out."""
    await register_many(fresh_sessions, 3)
    async with fresh_sessions() as session, session.begin():
        first = await session.scalar(select(func.min(OutboxMessage.id)))
        await session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.id == first)
            .values(routing_key="NO_SUCH_QUEUE")
        )
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await _wait_for(lambda: _count_unpublished_is(fresh_sessions, 1), 20, "good rows published")
        await asyncio.sleep(0.5)
        assert await unpublished(fresh_sessions) == 1
    finally:
        stop.set()
        await task
    bodies = await drain_queue(amqp_url, topology.queue_name(JobType.CARD_ANALYSIS))
    assert len(bodies) == 2


async def _count_unpublished_is(sessions: async_sessionmaker[AsyncSession], n: int) -> bool:
    return await unpublished(sessions) == n


async def test_cleanup_deletes_only_published_rows_past_retention(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    await register_many(fresh_sessions, 4)
    async with fresh_sessions() as session, session.begin():
        ids = list(await session.scalars(select(OutboxMessage.id).order_by(OutboxMessage.id)))
        # two old published rows, one fresh published row, one unpublished row
        await session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.id.in_(ids[:2]))
            .values(published_at=func.now() - timedelta(days=3))
        )
        await session.execute(
            update(OutboxMessage).where(OutboxMessage.id == ids[2]).values(published_at=func.now())
        )
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions)
    assert await relay.clean(timedelta(hours=24)) == 2
    async with fresh_sessions() as session:
        remaining = set(await session.scalars(select(OutboxMessage.id)))
    assert remaining == set(ids[2:])


async def _terminate_other_backends(sessions: async_sessionmaker[AsyncSession]) -> int:
    async with sessions() as session, session.begin():
        killed = await session.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    return int(killed or 0)


async def _listening(sessions: async_sessionmaker[AsyncSession]) -> bool:
    async with sessions() as session:
        found = await session.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query ILIKE 'LISTEN%san_outbox%'"
            )
        )
    return bool(found)


async def test_relay_listens_again_after_losing_its_connections(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The database drops every connection (a restart, a failover): the relay notices,
    listens again, and NOTIFY keeps waking it — with polling effectively off."""
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions, relay_poll_seconds=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await asyncio.wait_for(relay.ready.wait(), 20)
        await _wait_for(lambda: _listening(fresh_sessions), 10, "the first LISTEN")
        assert await _terminate_other_backends(fresh_sessions) >= 1
        await _wait_for(lambda: _listening(fresh_sessions), 10, "LISTEN again")
        await register_many(fresh_sessions, 3)
        await _wait_for(lambda: _zero(fresh_sessions), 10, "publish after reconnecting")
        assert not task.done()
    finally:
        stop.set()
        await task


async def test_a_failing_round_is_retried_not_fatal(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round that raises (database away mid-round) is logged and retried; the relay
    keeps running and publishes once the fault is gone."""
    from san_relay import repository

    real_claim = repository.claim_unpublished
    failures = 2

    async def flaky_claim(session, limit):  # type: ignore[no-untyped-def]
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionResetError("database went away")
        return await real_claim(session, limit)

    monkeypatch.setattr(repository, "claim_unpublished", flaky_claim)
    await register_many(fresh_sessions, 4)
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await _wait_for(lambda: _zero(fresh_sessions), 20, "publish after two failed rounds")
        assert failures == 0
    finally:
        stop.set()
        await task
