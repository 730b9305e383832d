"""Fixtures of the TIL suite: `worker` runs the ai-worker runtime in-process, fed by the real
relay over real RabbitMQ, calling the fake OpenAI-compatible server on loopback through the
real `openai` provider; `stack` (from the e2e suite) runs the services as OS processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from tests.api.support import Sessions
from tests.e2e.conftest import stack, stack_env  # noqa: F401  (the e2e suite's fixtures)
from tests.fakes.fake_ai import FakeAiServer
from tests.running import worker_and_relay


@dataclass
class Worker:
    sessions: Sessions
    ai: FakeAiServer
    db_url: str


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
        async with worker_and_relay(
            sessions, fresh_db_url, amqp_url, topology, build_handlers(provider)
        ):
            yield Worker(sessions, fake_ai, fresh_db_url)
    finally:
        fake_ai.chat_override = None
        await provider.aclose()
        await engine.dispose()
