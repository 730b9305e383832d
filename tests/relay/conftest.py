from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology, declare_topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.registration import register_job_in_transaction
from san_common.jobs.types import JobType
from san_common.models import OutboxMessage
from san_relay.relay import Relay
from san_relay.settings import RelaySettings


@pytest.fixture
async def fresh_sessions(fresh_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(fresh_db_url, pool_size=10)
    yield create_session_factory(engine)
    await engine.dispose()


def relay_settings(
    db_url: str, amqp_url: str, topology: Topology, **overrides: object
) -> RelaySettings:
    # These tests publish into queues nobody consumes: a window that never binds keeps
    # them about publishing (the windows themselves: tests/faults/test_fair_share.py).
    settings: dict[str, object] = {"relay_window_min": 100_000, **overrides}
    return RelaySettings(
        database_url=db_url,
        amqp_url=amqp_url,
        amqp_prefix=topology.prefix,
        san_env="test",
        **settings,  # type: ignore[arg-type]
    )


def make_relay(
    db_url: str,
    amqp_url: str,
    topology: Topology,
    sessions: async_sessionmaker[AsyncSession],
    **kw: object,
) -> Relay:
    return Relay(relay_settings(db_url, amqp_url, topology, **kw), sessions, topology)


async def publish_all(
    db_url: str, amqp_url: str, topology: Topology, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """Publish every due outbox row, one relay round after another, until a round finds
    none."""
    relay = make_relay(db_url, amqp_url, topology, sessions)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await declare_topology(channel, topology)
        while await relay.publish_once(channel):
            pass
    finally:
        await connection.close()


async def register_many(
    sessions: async_sessionmaker[AsyncSession],
    count: int,
    job_type: JobType = JobType.CARD_ANALYSIS,
) -> set[uuid.UUID]:
    job_ids: set[uuid.UUID] = set()
    user_id = uuid.uuid4()
    async with sessions() as session, session.begin():
        for _ in range(count):
            job = await register_job_in_transaction(
                session, job_type=job_type, target_id=uuid.uuid4(), user_id=user_id
            )
            job_ids.add(job.job_id)
    return job_ids


async def unpublished(sessions: async_sessionmaker[AsyncSession]) -> int:
    async with sessions() as session:
        return int(
            await session.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(OutboxMessage.published_at.is_(None))
            )
            or 0
        )


async def drain_queue(amqp_url: str, queue_name: str) -> list[dict[str, object]]:
    """Every message currently in the queue (acked), as parsed JSON bodies."""
    import json

    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(queue_name, ensure=False)
        bodies = []
        while (message := await queue.get(fail=False, no_ack=True)) is not None:
            bodies.append(json.loads(message.body))
        return bodies
    finally:
        await connection.close()


@dataclass
class Rounds:
    """The relay's rounds as a test sees them (`watch_rounds`); a test may reset a count."""

    started: int = 0
    finished: int = 0
    published: int = 0  # finished rounds that published at least one message
    in_flight: int = 0
    most: int = 0  # the most rounds in flight at once


def watch_rounds(relay: Relay, monkeypatch: pytest.MonkeyPatch) -> Rounds:
    """Count `relay`'s rounds as it runs them (each a real `publish_once`)."""
    rounds = Rounds()
    real_round = relay.publish_once

    async def watched_round(channel: AbstractChannel) -> int:
        rounds.started += 1
        rounds.in_flight += 1
        rounds.most = max(rounds.most, rounds.in_flight)
        try:
            published: int = await real_round(channel)
        finally:
            rounds.in_flight -= 1
        rounds.finished += 1
        rounds.published += published > 0
        return published

    monkeypatch.setattr(relay, "publish_once", watched_round)
    return rounds
