"""Guards below the runtime that the fault tests lean on, each the catching test of a
mutation in `tests/faults/mutations.py`: the relay's publisher confirms, the queues'
delivery limit, and the partial unique index covering PROCESSING jobs too."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import aio_pika
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import DELIVERY_LIMIT, Topology
from san_common.jobs import lifecycle as jobs
from san_common.jobs.registration import DuplicateActiveJob, register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, OutboxMessage
from tests.relay.conftest import make_relay, register_many
from tests.waiting import eventually


@pytest.fixture
def sessions(fresh_sessions: async_sessionmaker[AsyncSession]) -> async_sessionmaker[AsyncSession]:
    """This module's tests each on a database of their own."""
    return fresh_sessions


async def _published(sessions: async_sessionmaker[AsyncSession]) -> tuple[int, int]:
    async with sessions() as session:
        row = (
            await session.execute(
                select(
                    func.count().filter(OutboxMessage.published_at.is_not(None)),
                    func.count().filter(OutboxMessage.published_at.is_(None)),
                )
            )
        ).one()
    return int(row[0]), int(row[1])


@pytest.mark.rabbit
async def test_the_running_relay_never_marks_a_message_the_broker_did_not_confirm(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """`Relay.run` as deployed: a message the broker cannot route is returned, never
    confirmed, so its row stays unpublished while the rest of its batch goes out."""
    await register_many(sessions, 3)
    async with sessions() as session, session.begin():
        first = await session.scalar(select(func.min(OutboxMessage.id)))
        await session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.id == first)
            .values(routing_key="NO_SUCH_QUEUE")
        )
    relay = make_relay(fresh_db_url, amqp_url, topology, sessions)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:

        async def good_rows_out() -> bool:
            return (await _published(sessions))[0] >= 2

        await eventually(good_rows_out, within=20, what="the routable rows published")
        assert await _published(sessions) == (2, 1)
    finally:
        stop.set()
        await task


@pytest.mark.rabbit
async def test_a_message_requeued_past_the_delivery_limit_is_dead_lettered(
    amqp_url: str, topology: Topology
) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        exchange = await channel.get_exchange(topology.jobs_exchange)
        body = f"poison {uuid.uuid4()}".encode()
        await exchange.publish(aio_pika.Message(body), routing_key=JobType.SCRAP_REFINE)
        queue = await channel.get_queue(topology.queue_name(JobType.SCRAP_REFINE))
        dead = await channel.get_queue(topology.dead_letter_queue)
        deliveries = 0
        for _ in range(DELIVERY_LIMIT + 5):
            message = await queue.get(fail=False, timeout=5)
            if message is None:
                break
            deliveries += 1
            await message.nack(requeue=True)

        async def dead_lettered() -> bool:
            message = await dead.get(fail=False, no_ack=True)
            return message is not None and message.body == body

        await eventually(dead_lettered, within=10, what="the message in the dead-letter queue")
        assert deliveries <= DELIVERY_LIMIT + 1
    finally:
        await connection.close()


async def test_a_processing_job_still_blocks_a_second_active_job_for_its_target(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    target, user = uuid.uuid4(), uuid.uuid4()
    first = await register_job(
        sessions, job_type=JobType.SCRAP_REFINE, target_id=target, user_id=user
    )
    async with sessions() as session, session.begin():
        assert await jobs.claim(session, first.job_id, "w-1", timedelta(seconds=30)) is not None
    with pytest.raises(DuplicateActiveJob):
        await register_job(sessions, job_type=JobType.SCRAP_REFINE, target_id=target, user_id=user)
    async with sessions() as session, session.begin():
        await session.execute(
            update(AsyncJob).where(AsyncJob.job_id == first.job_id).values(status="COMPLETED")
        )
    again = await register_job(
        sessions, job_type=JobType.SCRAP_REFINE, target_id=target, user_id=user
    )
    assert again.job_id != first.job_id
