"""The relay against real PostgreSQL and RabbitMQ."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta

import aio_pika
import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology, declare_topology
from san_common.jobs.registration import register_job_in_transaction
from san_common.jobs.types import JobType
from san_common.models import OutboxMessage
from san_relay.relay import RoundFailed
from tests.faults.harness import run_sql
from tests.relay.conftest import (
    drain_queue,
    make_relay,
    register_many,
    unpublished,
    watch_rounds,
)
from tests.tcp_proxy import TcpProxy
from tests.waiting import eventually

pytestmark = pytest.mark.rabbit


async def _queue_messages(
    amqp_url: str, queue: str, expected: int, within: float = 20
) -> list[dict[str, object]]:
    """Messages taken from the queue until at least `expected` arrived; the callers check
    which ones."""
    seen: list[dict[str, object]] = []

    async def enough() -> bool:
        seen.extend(await drain_queue(amqp_url, queue))
        return len(seen) >= expected

    await eventually(
        enough,
        within=within,
        what=f"{expected} messages in {queue}",
        context=lambda: f"{len(seen)} arrived",
    )
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
        await eventually(lambda: _zero(fresh_sessions), within=20, what="outbox drained")
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
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A poll interval far longer than the test: only LISTEN/NOTIFY can publish in time.
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions, relay_poll_seconds=3600)
    rounds = watch_rounds(relay, monkeypatch)

    async def first_round_done() -> bool:
        return rounds.finished >= 1

    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        # Rows registered before the first (empty) round ends would go out with it, notify
        # or not; after it, the relay sleeps on LISTEN for the poll interval.
        await eventually(first_round_done, within=20, what="the relay's first round")
        await register_many(fresh_sessions, 3)
        await eventually(lambda: _zero(fresh_sessions), within=5, what="notify-driven publish")
    finally:
        stop.set()
        await task


async def test_a_row_scheduled_for_later_is_published_when_due_not_at_the_poll(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    # A retry's message is written due later, and its NOTIFY wakes the relay too early:
    # the round finds nothing due and must wake by itself when the row falls due, since
    # nothing else will before the poll (an hour here).
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions, relay_poll_seconds=3600)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await asyncio.wait_for(relay.ready.wait(), 20)
        user_id = uuid.uuid4()
        async with fresh_sessions() as session, session.begin():
            job_ids = [
                (
                    await register_job_in_transaction(
                        session,
                        job_type=JobType.CARD_ANALYSIS,
                        target_id=uuid.uuid4(),
                        user_id=user_id,
                    )
                ).job_id
                for _ in range(3)
            ]
            # due in 1.5 s, in the same transaction: the commit's NOTIFY finds none due
            await session.execute(
                update(OutboxMessage).values(available_at=func.now() + timedelta(seconds=1.5))
            )
        await eventually(lambda: _zero(fresh_sessions), within=15, what="the due-time publish")
        bodies = await _queue_messages(amqp_url, topology.queue_name(JobType.CARD_ANALYSIS), 3)
        async with fresh_sessions() as session:
            early = await session.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(OutboxMessage.published_at < OutboxMessage.available_at)
            )
    finally:
        stop.set()
        await task
    assert {b["job_id"] for b in bodies} == {str(j) for j in job_ids}
    assert early == 0, "a row went out before it was due"


@pytest.mark.parametrize("rounds", [1, 2])
async def test_under_a_backlog_rounds_overlap_and_publish_each_row_once(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
    rounds: int,
) -> None:
    relay = make_relay(
        fresh_db_url,
        amqp_url,
        topology,
        fresh_sessions,
        relay_batch_size=20,
        relay_rounds_in_flight=rounds,
        relay_poll_seconds=3600,  # only NOTIFY wakes a round
    )
    watched = watch_rounds(relay, monkeypatch)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:

        async def idle() -> bool:  # each round has run (at start-up: its empty claim), none runs
            return relay.ready.is_set() and watched.most == rounds and watched.in_flight == 0

        await eventually(idle, within=20, what="the rounds' first claims")
        watched.most = 0
        job_ids = await register_many(fresh_sessions, 400)  # 20 batches, one NOTIFY
        await eventually(lambda: _zero(fresh_sessions), within=60, what="the backlog published")
        queue = topology.queue_name(JobType.CARD_ANALYSIS)
        bodies = await _queue_messages(amqp_url, queue, 400)
        await eventually(idle, within=20, what="the rounds back to waiting")
        # the followers joined the leader while the backlog lasted, and never more rounds
        assert watched.most == rounds
        assert sorted(str(b["job_id"]) for b in bodies) == sorted(str(j) for j in job_ids)

        # a lone message wakes the leader alone: one round, not one per round in flight
        watched.started = 0
        await register_many(fresh_sessions, 1)
        await eventually(lambda: _zero(fresh_sessions), within=20, what="the lone message")
        # a round woken by the same NOTIFY starts with the leader's, long before its commit
        await eventually(idle, within=20, what="the rounds back to waiting")
        assert watched.started == 1
    finally:
        stop.set()
        await task


async def test_messages_that_keep_coming_share_rounds_spaced_apart(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Registrations committed one by one, back to back: each NOTIFY would start a round of
    its own (a claim, a publish, a confirm and a commit per message). Within the spacing of
    the last round that published, the leader waits for the rest of it, so the rounds that
    publish are at most one per spacing, and every message still goes out once."""
    spacing = 0.2
    relay = make_relay(
        fresh_db_url,
        amqp_url,
        topology,
        fresh_sessions,
        relay_rounds_in_flight=1,
        relay_poll_seconds=3600,  # only NOTIFY wakes a round
        relay_round_spacing_seconds=spacing,
    )
    rounds = watch_rounds(relay, monkeypatch)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await asyncio.wait_for(relay.ready.wait(), 20)
        job_ids: set[uuid.UUID] = set()
        started = asyncio.get_running_loop().time()
        for _ in range(60):  # 60 transactions, each with its own NOTIFY
            job_ids |= await register_many(fresh_sessions, 1)
        elapsed = asyncio.get_running_loop().time() - started
        await eventually(lambda: _zero(fresh_sessions), within=20, what="every message")
        bodies = await _queue_messages(amqp_url, topology.queue_name(JobType.CARD_ANALYSIS), 60)
    finally:
        stop.set()
        await task
    assert sorted(str(b["job_id"]) for b in bodies) == sorted(str(j) for j in job_ids)
    # one round may start as the first message arrives, then one per spacing at most
    assert rounds.published <= 2 + elapsed / spacing, (rounds.published, elapsed)


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
        await eventually(
            lambda: _zero(fresh_sessions), within=60, what="outbox drained by two relays"
        )
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
    """Outbox rows the broker cannot route (no queue is bound to their routing key) are never
    confirmed: they stay unpublished (and are retried), while the good rows of the same batch
    go out. Rounds are driven one by one on a channel set up as `Relay.run` sets it up."""
    await register_many(fresh_sessions, 3)
    async with fresh_sessions() as session, session.begin():
        first = await session.scalar(select(func.min(OutboxMessage.id)))
        await session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.id == first)
            .values(routing_key="NO_SUCH_QUEUE")
        )
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await declare_topology(channel, topology)
        assert await relay.publish_once(channel) == 2
        assert await unpublished(fresh_sessions) == 1
        # the next round retries it, in vain: a round that confirms nothing is a failure,
        # which the run loop backs off from (one warning per round, not per message)
        with pytest.raises(RoundFailed, match="none of 1 messages"):
            await relay.publish_once(channel)
        assert await unpublished(fresh_sessions) == 1
    finally:
        await connection.close()
    bodies = await drain_queue(amqp_url, topology.queue_name(JobType.CARD_ANALYSIS))
    assert len(bodies) == 2


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
        await eventually(lambda: _listening(fresh_sessions), within=10, what="the first LISTEN")
        assert await _terminate_other_backends(fresh_sessions) >= 1
        await eventually(lambda: _listening(fresh_sessions), within=10, what="LISTEN again")
        await register_many(fresh_sessions, 3)
        await eventually(
            lambda: _zero(fresh_sessions), within=10, what="publish after reconnecting"
        )
        assert not task.done()
    finally:
        stop.set()
        await task


# The relay's first two claims terminate their own backend: its connection dies mid-round.
# A sequence counts them (it is not rolled back with the round's transaction).
KILL_TWO_CLAIMS = """
CREATE SEQUENCE killed_claims;
ALTER FUNCTION claim_outbox(integer) RENAME TO claim_outbox_real;
CREATE FUNCTION claim_outbox(batch integer)
RETURNS TABLE (
    id bigint, message_id uuid, exchange text, routing_key text, body text, headers text,
    created_at timestamptz, traceparent text, tracestate text, next_due_seconds double precision
)
LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('killed_claims') <= 2 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(5);
    END IF;
    RETURN QUERY SELECT * FROM claim_outbox_real(batch) AS real;
END $$;
"""


async def test_a_failing_round_is_retried_not_fatal(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    """A round whose connection dies (its backend terminated mid-claim) is logged and
    retried; the relay keeps running and publishes once the fault is gone."""
    await run_sql(fresh_db_url, KILL_TWO_CLAIMS)
    await register_many(fresh_sessions, 4)
    relay = make_relay(fresh_db_url, amqp_url, topology, fresh_sessions)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        await eventually(
            lambda: _zero(fresh_sessions), within=20, what="publish after two failed rounds"
        )
        assert not task.done()
        assert await run_sql(fresh_db_url, "SELECT last_value FROM killed_claims") >= 3
    finally:
        stop.set()
        await task


OUTAGE_SECONDS = 20.0
# "A few dozen" (issue 11): one line per failed round, backing off, plus aio-pika's own
# reconnect warnings — not one per message (thousands before).
MAX_OUTAGE_WARNINGS = 36


async def test_a_broker_outage_costs_a_few_warnings_not_one_per_message(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with TcpProxy(amqp_url) as proxy:
        relay = make_relay(fresh_db_url, proxy.url, topology, fresh_sessions)
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        try:
            await asyncio.wait_for(relay.ready.wait(), 30)
            await register_many(fresh_sessions, 50)  # a backlog at the moment it breaks
            caplog.set_level(logging.WARNING)
            caplog.clear()
            await asyncio.to_thread(proxy.cut)
            loop = asyncio.get_running_loop()
            ends = loop.time() + OUTAGE_SECONDS
            while loop.time() < ends:  # jobs keep arriving, each NOTIFY wakes the relay
                await register_many(fresh_sessions, 5)
                await asyncio.sleep(0.1)  # the workload's arrival rate, not a wait
            await asyncio.to_thread(proxy.restore)
            await eventually(
                lambda: _zero(fresh_sessions), within=90, what="the backlog published after"
            )
            # the whole outage and the recovery from it (a round may still be waiting on
            # its publish timeout when the broker comes back)
            warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        finally:
            stop.set()
            await task
    # r.msg, not getMessage(): some of aio-pika's records cannot format their arguments
    assert len(warnings) <= MAX_OUTAGE_WARNINGS, [(r.name, str(r.msg)) for r in warnings]
