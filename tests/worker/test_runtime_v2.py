"""Runtime v2 end to end in-process (real PostgreSQL, RabbitMQ, relay): retries through
the outbox without holding a slot (issue 9, acceptance 5). A job type added through the
registry alone: tests/jobtype."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_api.app import create_app
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.repository import tries_of
from san_common.jobs.types import JobType
from san_common.worker import RuntimeConfig
from tests.conftest import api_settings
from tests.fakes.fake_ai import FakeAiServer
from tests.running import worker_and_relay
from tests.waiting import eventually, settled_job_via_api

pytestmark = pytest.mark.rabbit


@pytest.fixture
async def fresh(fresh_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """A database of the test's own: the shared one holds other tests' unpublished outbox
    rows, which a relay would publish (and a worker run) before this test's."""
    engine = create_engine(fresh_db_url, pool_size=10)
    yield create_session_factory(engine)
    await engine.dispose()


@pytest.fixture
async def fresh_api(fresh_db_url: str, amqp_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(api_settings(fresh_db_url, amqp_url))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield client


@pytest.fixture
async def ai_provider(fake_ai: FakeAiServer) -> AsyncIterator[Any]:
    fake_ai.set_fault(None)
    provider = build_provider("openai", base_url=fake_ai.base_url, api_key="k", timeout_seconds=5)
    yield provider
    fake_ai.set_fault(None)
    await provider.aclose()


async def test_a_job_waiting_for_its_retry_holds_no_slot_and_completes_under_its_id(
    fresh_api: httpx.AsyncClient,
    new_user: Any,
    fresh: async_sessionmaker[AsyncSession],
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fake_ai: FakeAiServer,
    ai_provider: Any,
) -> None:
    handlers = {JobType.CARD_ANALYSIS: build_handlers(ai_provider)[JobType.CARD_ANALYSIS]}
    # One job at a time, and a retry 8 s away: what completes meanwhile did so while the
    # first job waited, not after it.
    config = RuntimeConfig(prefetch=1, max_tries=3, backoff_seconds=8.0, lease_seconds=20)
    headers = new_user()
    fake_ai.set_fault("http_500", times=1)
    async with worker_and_relay(fresh, fresh_db_url, amqp_url, topology, handlers, config):
        first = await fresh_api.post(
            "/scraps", json={"content": f"retry {uuid.uuid4()}"}, headers=headers
        )
        waiting_id = first.json()["analysisJobId"]
        view: dict[str, Any] = {}

        async def waiting_for_retry() -> bool:
            nonlocal view
            view = (await fresh_api.get(f"/async-jobs/{waiting_id}", headers=headers)).json()
            return view["nextAttemptAt"] is not None

        await eventually(waiting_for_retry, within=60, what="the first try to fail")
        assert (view["status"], view["tries"], view["errorMessage"]) == ("PENDING", 1, None)
        assert view["lastError"] and "upstream status 500" in view["lastError"]
        next_attempt = datetime.fromisoformat(view["nextAttemptAt"])

        second = await fresh_api.post(
            "/scraps", json={"content": f"other {uuid.uuid4()}"}, headers=headers
        )
        other = await settled_job_via_api(fresh_api, headers, second.json()["analysisJobId"])
        assert other["status"] == "COMPLETED"
        assert datetime.fromisoformat(other["finishedAt"]) < next_attempt

        done = await settled_job_via_api(fresh_api, headers, waiting_id, within=60)
    assert (done["jobId"], done["status"], done["tries"]) == (waiting_id, "COMPLETED", 2)
    assert done["nextAttemptAt"] is None and done["errorMessage"] is None
    async with fresh() as session:
        outcomes = [t.outcome for t in await tries_of(session, uuid.UUID(waiting_id))]
    assert outcomes == ["retry", "completed"]
