"""The worker runtime and the relay in this test's event loop — the real consumption path
(outbox → relay → RabbitMQ → runtime → handlers) without separate processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from san_common.worker import JobHandler, RuntimeConfig, WorkerRuntime
from san_common.worker.executor import Gate
from san_relay.relay import Relay
from san_relay.settings import RelaySettings

# Quick retries, so failure paths settle in milliseconds.
FAST = RuntimeConfig(prefetch=10, max_tries=2, backoff_seconds=0.01, lease_seconds=30)


@asynccontextmanager
async def worker_and_relay(
    sessions: async_sessionmaker[AsyncSession],
    db_url: str,
    amqp_url: str,
    topology: Topology,
    handlers: Mapping[JobType, JobHandler],
    config: RuntimeConfig = FAST,
    gate: Gate | None = None,
) -> AsyncIterator[WorkerRuntime]:
    """Both running (the worker consuming) inside the block, drained and stopped after."""
    runtime = WorkerRuntime(
        session_factory=sessions,
        amqp_url=amqp_url,
        topology=topology,
        handlers=handlers,
        config=config,
        gate=gate,
    )
    relay = Relay(
        RelaySettings(database_url=db_url, amqp_url=amqp_url, amqp_prefix=topology.prefix),
        sessions,
        topology,
    )
    stop = asyncio.Event()
    tasks = [asyncio.create_task(runtime.run(stop)), asyncio.create_task(relay.run(stop))]
    try:
        await asyncio.wait_for(runtime.connected.wait(), 20)
        yield runtime
    finally:
        stop.set()
        await asyncio.gather(*tasks)
