"""The relay's gauges: outbox backlog, age of the oldest unpublished row, queue depths."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.types import JobType
from san_common.models import OutboxMessage
from san_relay.relay import Relay
from san_relay.settings import RelaySettings


@pytest.fixture
async def relay(
    fresh_db_url: str, amqp_url: str
) -> AsyncIterator[tuple[Relay, async_sessionmaker[AsyncSession]]]:
    engine = create_engine(fresh_db_url, pool_size=2)
    sessions = create_session_factory(engine)
    settings = RelaySettings(database_url=fresh_db_url, amqp_url=amqp_url, san_env="test")
    yield Relay(settings, sessions, Topology(settings.amqp_prefix)), sessions
    await engine.dispose()


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


async def test_backlog_and_oldest_age_follow_the_unpublished_rows(
    relay: tuple[Relay, async_sessionmaker[AsyncSession]],
) -> None:
    observer, sessions = relay
    now = datetime.now(UTC)
    rows = [
        (now - timedelta(seconds=120), None),
        (now - timedelta(seconds=30), None),
        (now - timedelta(hours=1), now),
    ]
    async with sessions() as session, session.begin():
        for created_at, published_at in rows:
            await session.execute(
                insert(OutboxMessage).values(
                    message_id=uuid.uuid4(),
                    exchange="jobs",
                    routing_key="CARD_ANALYSIS",
                    body={},
                    headers={},
                    created_at=created_at,
                    available_at=created_at,
                    published_at=published_at,
                )
            )
        # Scheduled for later (a retry): not backlog yet.
        await session.execute(
            insert(OutboxMessage).values(
                message_id=uuid.uuid4(),
                exchange="jobs",
                routing_key="CARD_ANALYSIS",
                body={},
                headers={},
                created_at=now - timedelta(hours=2),
                available_at=now + timedelta(hours=1),
            )
        )
    await observer.observe_outbox()
    assert sample("san_outbox_backlog") == 2
    oldest = sample("san_outbox_oldest_unpublished_age_seconds")
    assert oldest is not None and 120 <= oldest < 180

    async with sessions() as session, session.begin():
        await session.execute(
            update(OutboxMessage).where(OutboxMessage.available_at <= now).values(published_at=now)
        )
    await observer.observe_outbox()
    assert sample("san_outbox_backlog") == 0
    assert sample("san_outbox_oldest_unpublished_age_seconds") == 0


@pytest.mark.rabbit
async def test_queue_depth_counts_the_messages_waiting(
    fresh_db_url: str, amqp_url: str, topology: Topology
) -> None:
    engine = create_engine(fresh_db_url, pool_size=2)
    observer = Relay(
        RelaySettings(
            database_url=fresh_db_url,
            amqp_url=amqp_url,
            amqp_prefix=topology.prefix,
            san_env="test",
        ),
        create_session_factory(engine),
        topology,
    )
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topology.jobs_exchange)
        for _ in range(3):
            await exchange.publish(aio_pika.Message(b"{}"), routing_key=JobType.SCRAP_REFINE.value)
        await observer.observe_queues(channel)
    finally:
        await connection.close()
        await engine.dispose()
    assert sample("san_queue_messages_ready", queue=topology.queue_name(JobType.SCRAP_REFINE)) == 3
    assert sample("san_queue_messages_ready", queue=topology.queue_name(JobType.CARD_ANALYSIS)) == 0
    assert sample("san_queue_messages_ready", queue=topology.dead_letter_queue) == 0
