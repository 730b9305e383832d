"""Fixtures of the TIL suite: `worker` runs the ai-worker runtime in-process, fed by the real
relay over real RabbitMQ, calling the fake OpenAI-compatible server on loopback through the
real `openai` provider; `stack` (from the e2e suite) runs the services as OS processes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.types import JobType
from san_common.worker import JobHandler, RuntimeConfig, WorkerRuntime
from san_relay.relay import Relay
from san_relay.settings import RelaySettings
from tests.api.support import Sessions
from tests.e2e.conftest import stack, stack_env  # noqa: F401  (the e2e suite's fixtures)
from tests.fakes.fake_ai import FakeAiServer


@dataclass
class Worker:
    sessions: Sessions
    ai: FakeAiServer
    db_url: str


@asynccontextmanager
async def running_worker(
    sessions: Sessions,
    db_url: str,
    amqp_url: str,
    topology: Topology,
    handlers: Mapping[JobType, JobHandler],
) -> AsyncIterator[None]:
    """The worker runtime and the relay, running until the block ends."""
    runtime = WorkerRuntime(
        session_factory=sessions,
        amqp_url=amqp_url,
        topology=topology,
        handlers=handlers,
        config=RuntimeConfig(prefetch=10, max_tries=2, backoff_seconds=0.01, lease_seconds=30),
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
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


@pytest.fixture
async def worker(
    fresh_db_url: str, amqp_url: str, topology: Topology, fake_ai: FakeAiServer
) -> AsyncIterator[Worker]:
    engine = create_engine(fresh_db_url, pool_size=10)
    sessions = create_session_factory(engine)
    provider = build_provider("openai", base_url=fake_ai.base_url, timeout_seconds=2)
    fake_ai.set_fault(None)
    fake_ai.chat_override = None
    try:
        async with running_worker(
            sessions, fresh_db_url, amqp_url, topology, build_handlers(provider)
        ):
            yield Worker(sessions, fake_ai, fresh_db_url)
    finally:
        fake_ai.chat_override = None
        await provider.aclose()
        await engine.dispose()
