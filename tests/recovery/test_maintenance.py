"""The maintenance tasks one by one, against real PostgreSQL and RabbitMQ: the stranded-
message check (services/recovery/src/san_recovery/stranded.py) and the outbox cleanup.
Their acceptance with real processes (a purge healed, a backlog drained without a storm)
is tests/faults/test_stranded.py."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import aio_pika
import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.depths import QueueDepths
from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, OutboxMessage
from san_recovery import outbox_cleanup
from san_recovery.stranded import NOTE, StrandedCheck
from tests.relay.conftest import publish_all, register_many, unpublished

pytestmark = [pytest.mark.rabbit, pytest.mark.timeout(60)]

GRACE = timedelta(seconds=1)


async def _publish_all(
    db_url: str, amqp_url: str, topology: Topology, sessions: async_sessionmaker[AsyncSession]
) -> None:
    await publish_all(db_url, amqp_url, topology, sessions)
    assert await unpublished(sessions) == 0


async def _purge(amqp_url: str, queue: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await (await channel.get_queue(queue, ensure=True)).purge()
    finally:
        await connection.close()


async def _messages_of(sessions: async_sessionmaker[AsyncSession], job_ids: set[uuid.UUID]) -> int:
    async with sessions() as session:
        return int(
            await session.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(OutboxMessage.body["job_id"].astext.in_([str(j) for j in job_ids]))
            )
            or 0
        )


async def _past_grace() -> None:
    await asyncio.sleep(GRACE.total_seconds() + 0.2)  # the grace is the property under test


async def test_purged_messages_are_republished_once_on_the_second_sighting(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    jobs = await register_many(fresh_sessions, 6)
    await _publish_all(fresh_db_url, amqp_url, topology, fresh_sessions)
    await _purge(amqp_url, topology.queue_name(JobType.CARD_ANALYSIS))
    await _past_grace()
    check = StrandedCheck(fresh_sessions, depths, topology, grace=GRACE)

    assert await check.run_once() == 0, "a first sighting only makes suspects"
    assert await check.run_once() == 6
    assert await _messages_of(fresh_sessions, jobs) == 12, "one new message per job"
    async with fresh_sessions() as session:
        rows = (await session.scalars(select(AsyncJob).where(AsyncJob.job_id.in_(jobs)))).all()
    assert {(r.status, r.last_error) for r in rows} == {("PENDING", NOTE)}
    # Their new messages wait in the outbox (nothing publishes here): counted, not missing.
    await _past_grace()
    assert await check.run_once() == 0
    assert await check.run_once() == 0


async def test_two_replicas_republish_each_missing_message_once(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    jobs = await register_many(fresh_sessions, 8)
    await _publish_all(fresh_db_url, amqp_url, topology, fresh_sessions)
    await _purge(amqp_url, topology.queue_name(JobType.CARD_ANALYSIS))
    await _past_grace()
    other_depths = QueueDepths(amqp_url)
    try:
        replicas = [
            StrandedCheck(fresh_sessions, reader, topology, grace=GRACE)
            for reader in (depths, other_depths)
        ]
        republished = 0
        for _ in range(4):  # both at once, again and again: each sees, suspects, confirms
            rounds = await asyncio.gather(*(r.run_once() for r in replicas))
            republished += sum(rounds)
    finally:
        await other_depths.close()
    assert republished == 8
    assert await _messages_of(fresh_sessions, jobs) == 16


async def test_messages_in_the_queue_are_never_republished(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    jobs = await register_many(fresh_sessions, 5)
    await _publish_all(fresh_db_url, amqp_url, topology, fresh_sessions)
    await _past_grace()
    check = StrandedCheck(fresh_sessions, depths, topology, grace=GRACE)
    for _ in range(3):
        assert await check.run_once() == 0
    assert await _messages_of(fresh_sessions, jobs) == 5


async def test_only_the_missing_ones_are_republished_the_longest_waiting_first(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    older = await register_many(fresh_sessions, 4)
    async with fresh_sessions() as session, session.begin():
        await session.execute(
            update(AsyncJob)
            .where(AsyncJob.job_id.in_(older))
            .values(updated_at=func.now() - timedelta(minutes=1))
        )
    await _publish_all(fresh_db_url, amqp_url, topology, fresh_sessions)
    # a consumer that is not ours takes the four oldest messages (the head of the queue)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(topology.queue_name(JobType.CARD_ANALYSIS))
        for _ in range(4):
            assert await queue.get(no_ack=True, fail=True) is not None
    finally:
        await connection.close()
    newer = await register_many(fresh_sessions, 3)
    await _publish_all(fresh_db_url, amqp_url, topology, fresh_sessions)
    await _past_grace()
    check = StrandedCheck(fresh_sessions, depths, topology, grace=GRACE)
    assert await check.run_once() == 0
    assert await check.run_once() == 4
    assert await _messages_of(fresh_sessions, older) == 8
    assert await _messages_of(fresh_sessions, newer) == 3


async def test_jobs_waiting_for_the_relay_are_not_missing(
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    jobs = await register_many(fresh_sessions, 3)  # never published: the relay is behind
    await _past_grace()
    check = StrandedCheck(fresh_sessions, depths, topology, grace=GRACE)
    for _ in range(2):
        assert await check.run_once() == 0
    assert await _messages_of(fresh_sessions, jobs) == 3


async def test_jobs_whose_direct_publish_waits_for_the_relay_are_not_missing(
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    """A row the API was to publish itself and did not (docs/architecture.md, "Direct
    publish") is due for the relay only after its grace, however long; its job has waited
    since the row's creation. Counted as waiting for the relay, not as missing."""
    jobs = await register_many(fresh_sessions, 3)
    async with fresh_sessions() as session, session.begin():
        await session.execute(
            text(
                "UPDATE outbox_messages SET direct = true,"
                " available_at = created_at + interval '1 hour'"
                " WHERE body->>'job_id' = ANY(:ids)"
            ),
            {"ids": [str(j) for j in jobs]},
        )
    await _past_grace()
    check = StrandedCheck(fresh_sessions, depths, topology, grace=GRACE)
    for _ in range(2):
        assert await check.run_once() == 0
    assert await _messages_of(fresh_sessions, jobs) == 3


async def test_a_queue_that_does_not_exist_is_skipped(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    await register_many(fresh_sessions, 2)
    await _publish_all(fresh_db_url, amqp_url, topology, fresh_sessions)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(topology.queue_name(JobType.CARD_ANALYSIS))
    finally:
        await connection.close()
    await _past_grace()
    check = StrandedCheck(fresh_sessions, depths, topology, grace=GRACE)
    for _ in range(2):
        assert await check.run_once() == 0  # nothing could carry a message there


async def test_cleanup_deletes_only_published_rows_past_retention(
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
    assert await outbox_cleanup.clean(fresh_sessions, timedelta(hours=24)) == 2
    async with fresh_sessions() as session:
        remaining = set(await session.scalars(select(OutboxMessage.id)))
    assert remaining == set(ids[2:])
