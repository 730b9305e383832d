"""A job queue's bulk lane (docs/architecture.md, "Fair share and priorities"): a backlog
that overfills its queue's window goes into the lane when it is one user's and nobody else
has work due for the queue, and the lane never holds two users' messages, so nobody's work
waits behind another's there. Relay rounds against real PostgreSQL and RabbitMQ; nobody
consumes, so each queue's window is `WINDOW` messages."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology
from san_common.jobs.admission import Priority
from san_common.jobs.registration import register_job_in_transaction
from san_common.jobs.types import JobType
from san_relay.relay import Relay
from tests.relay.conftest import drain_queue, make_relay, unpublished, watch_rounds
from tests.waiting import eventually

pytestmark = pytest.mark.rabbit

WINDOW = 5
JOB = JobType.CARD_ANALYSIS


def _relay(
    db_url: str,
    amqp_url: str,
    topology: Topology,
    sessions: async_sessionmaker[AsyncSession],
    **overrides: object,
) -> Relay:
    return make_relay(
        db_url,
        amqp_url,
        topology,
        sessions,
        relay_window_min=WINDOW,
        relay_window_seconds=0,
        **overrides,
    )


async def _run(
    relay: Relay,
    sessions: async_sessionmaker[AsyncSession],
    left: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run `relay` until the outbox holds `left` unpublished rows; with rows left, until
    three more of its rounds have ended too (a round that would publish more had its
    chance: while rows are held back, a round runs every window poll)."""
    rounds = watch_rounds(relay, monkeypatch)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:

        async def settled() -> bool:
            return await unpublished(sessions) == left

        await eventually(settled, within=30, what=f"{left} rows left in the outbox")
        if left:
            after = rounds.finished + 3

            async def three_more_rounds() -> bool:
                return rounds.finished >= after

            await eventually(three_more_rounds, within=10, what="three more relay rounds")
    finally:
        stop.set()
        await task
    assert await unpublished(sessions) == left


async def _register(
    sessions: async_sessionmaker[AsyncSession],
    user_id: uuid.UUID,
    count: int,
    priority: Priority = Priority.INTERACTIVE,
) -> None:
    async with sessions() as session, session.begin():
        for _ in range(count):
            await register_job_in_transaction(
                session, job_type=JOB, target_id=uuid.uuid4(), user_id=user_id, priority=priority
            )


def _users(bodies: list[dict[str, object]]) -> Counter[str]:
    return Counter(str(b["user_id"]) for b in bodies)


async def test_one_users_backlog_goes_into_the_bulk_lane_not_the_outbox(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = uuid.uuid4()
    await _register(fresh_sessions, a, 60)
    await _run(
        _relay(fresh_db_url, amqp_url, topology, fresh_sessions), fresh_sessions, 0, monkeypatch
    )

    assert _users(await drain_queue(amqp_url, topology.bulk_queue_name(JOB))) == {str(a): 60}
    assert await drain_queue(amqp_url, topology.queue_name(JOB)) == []


async def test_the_lane_is_not_given_to_another_user_while_it_holds_the_first_ones(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, c = uuid.uuid4(), uuid.uuid4()
    await _register(fresh_sessions, a, 40)
    await _run(
        _relay(fresh_db_url, amqp_url, topology, fresh_sessions), fresh_sessions, 0, monkeypatch
    )
    await _register(fresh_sessions, c, 30)  # C alone has work due now: A's is all published
    # another relay (no memory of the first one's): the lane's row says whose it is; C's
    # rest is held in the outbox
    relay = _relay(fresh_db_url, amqp_url, topology, fresh_sessions)
    await _run(relay, fresh_sessions, 30 - WINDOW, monkeypatch)

    assert _users(await drain_queue(amqp_url, topology.bulk_queue_name(JOB))) == {str(a): 40}
    assert _users(await drain_queue(amqp_url, topology.queue_name(JOB))) == {str(c): WINDOW}

    # the lane read empty (drained above): C's backlog may have it now
    await _run(
        _relay(fresh_db_url, amqp_url, topology, fresh_sessions), fresh_sessions, 0, monkeypatch
    )
    assert _users(await drain_queue(amqp_url, topology.bulk_queue_name(JOB))) == {
        str(c): 30 - WINDOW
    }
    async with fresh_sessions() as session:
        owner = await session.scalar(
            text("SELECT user_id FROM outbox_bulk_lanes WHERE queue = :q"),
            {"q": topology.queue_name(JOB)},
        )
    assert owner == c


async def test_with_two_users_due_the_backlog_waits_for_the_fair_claim(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    await _register(fresh_sessions, a, 30)
    await _register(fresh_sessions, b, 30)
    # a batch of A's rows only: B's due rows are what keeps it out of the lane
    relay = _relay(fresh_db_url, amqp_url, topology, fresh_sessions, relay_batch_size=20)
    await _run(relay, fresh_sessions, 60 - WINDOW, monkeypatch)

    assert await drain_queue(amqp_url, topology.bulk_queue_name(JOB)) == []
    main = _users(await drain_queue(amqp_url, topology.queue_name(JOB)))
    assert sum(main.values()) == WINDOW and set(main) == {str(a), str(b)}  # round-robin


async def test_a_users_interactive_work_is_not_put_behind_their_own_batch_work(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a = uuid.uuid4()
    await _register(fresh_sessions, a, 30, Priority.BATCH)
    await _register(fresh_sessions, a, 3)
    relay = _relay(fresh_db_url, amqp_url, topology, fresh_sessions, relay_batch_size=20)
    await _run(relay, fresh_sessions, 33 - WINDOW, monkeypatch)

    assert await drain_queue(amqp_url, topology.bulk_queue_name(JOB)) == []
    main = await drain_queue(amqp_url, topology.queue_name(JOB))
    assert len(main) == WINDOW
