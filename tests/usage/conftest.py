"""Fixtures of the usage suite: the API in-process (ASGI) and the ai-worker runtime with the
relay in-process, on one fresh database, the worker calling the fake AI on loopback through
the real `openai` provider with a price table of its own."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import httpx
import pytest
from sqlalchemy import func, select

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.budget import BudgetGate
from san_ai_worker.handlers import build_handlers
from san_api.app import create_app
from san_api.auth.tokens import mint
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs import registry
from san_common.models import AiUsage
from san_common.usage import Price, Prices
from san_common.usage.budgets import Limits
from san_common.worker import RuntimeConfig, WorkerRuntime
from tests.api.support import Sessions
from tests.conftest import JWT_SECRET, api_settings
from tests.fakes.fake_ai import FakeAiServer
from tests.running import worker_and_relay

# Not the defaults, so a cost that matches proves the table was read.
PRICES = Prices(
    {
        "gpt-4o-mini": Price(Decimal("1.5"), Decimal("6")),
        "text-embedding-3-small": Price(Decimal("0.2")),
    }
)
UNLIMITED = Limits(0, Decimal(0))
QUICK = RuntimeConfig(prefetch=10, max_tries=3, backoff_seconds=0.05, lease_seconds=30)


@dataclass
class System:
    sessions: Sessions
    ai: FakeAiServer
    api: httpx.AsyncClient
    worker: WorkerRuntime

    def headers(self, subject: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"}

    async def ledger(self, **where: Any) -> dict[str, Any]:
        """Ledger totals (of the rows matching `where`, column = value)."""
        async with self.sessions() as session:
            query = select(
                func.coalesce(func.sum(AiUsage.prompt_tokens), 0),
                func.coalesce(func.sum(AiUsage.completion_tokens), 0),
                func.coalesce(func.sum(AiUsage.embedding_tokens), 0),
                func.coalesce(func.sum(AiUsage.cost_usd), 0),
                func.count(),
            ).where(*(getattr(AiUsage, k) == v for k, v in where.items()))
            prompt, completion, embedding, cost, rows = (await session.execute(query)).one()
        return {
            "prompt": int(prompt),
            "completion": int(completion),
            "embedding": int(embedding),
            "cost": Decimal(cost),
            "rows": rows,
        }


@contextmanager
def job_timeout(job_type: str, seconds: float) -> Iterator[None]:
    """The registry's spec of `job_type` with another `timeout_seconds`, inside the block."""
    spec = registry.spec_for(job_type)
    registry.unregister(job_type)
    registry.register(dataclasses.replace(spec, timeout_seconds=seconds))
    try:
        yield
    finally:
        registry.unregister(job_type)
        registry.register(spec)


async def start_system(
    db_url: str,
    amqp_url: str,
    topology: Topology,
    ai: FakeAiServer,
    *,
    budget: Limits = UNLIMITED,
    at_run: Literal["wait", "fail"] = "wait",
    ai_timeout: float = 10.0,
) -> AsyncIterator[System]:
    engine = create_engine(db_url, pool_size=10)
    sessions = create_session_factory(engine)
    provider = build_provider(
        "openai", base_url=ai.base_url, timeout_seconds=ai_timeout, prices=PRICES
    )
    ai.set_fault(None)
    ai.chat_override = None
    ai.usage_supported = True
    ai.forget()
    app = create_app(
        api_settings(
            db_url,
            amqp_url,
            budget_tokens_per_day=budget.tokens_per_day,
            budget_usd_per_month=budget.usd_per_month,
        )
    )
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://api"
            ) as client,
            worker_and_relay(
                sessions,
                db_url,
                amqp_url,
                topology,
                build_handlers(provider),
                QUICK,
                gate=BudgetGate(sessions, budget, at_run),
            ) as worker,
        ):
            yield System(sessions, ai, client, worker)
    finally:
        ai.set_fault(None)
        await provider.aclose()
        await engine.dispose()


@pytest.fixture
async def system(
    fresh_db_url: str, amqp_url: str, topology: Topology, fake_ai: FakeAiServer
) -> AsyncIterator[System]:
    async for running in start_system(fresh_db_url, amqp_url, topology, fake_ai):
        yield running
