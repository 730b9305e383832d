"""`san-ai-worker`: consumes the AI job types.

Configured by the environment (DATABASE_URL, AMQP_URL, AI_*, WORKER_*; see
docs/operations.md). Exits 1 with one line when PostgreSQL or RabbitMQ cannot be reached
at start-up."""

from __future__ import annotations

from collections.abc import Sequence

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.budget import BudgetGate
from san_ai_worker.handlers import build_handlers
from san_ai_worker.settings import AiWorkerSettings
from san_common import cli
from san_common.broker.topology import Topology
from san_common.db.engine import create_session_factory
from san_common.settings import load_settings
from san_common.worker import WorkerRuntime
from san_common.worker.service import serve_worker

PROG = "san-ai-worker"


async def amain(settings: AiWorkerSettings) -> None:
    engine = settings.database_engine(pool_size=settings.worker_prefetch + 2)
    upstream = settings.quotas(engine)
    ai = build_provider(
        settings.ai_provider, **settings.provider_options(), upstream_quotas=upstream
    )
    github = settings.github_client(upstream)
    sessions = create_session_factory(engine)
    runtime = WorkerRuntime(
        session_factory=sessions,
        amqp_url=settings.amqp_url,
        topology=Topology(settings.amqp_prefix),
        handlers=build_handlers(ai, github=github, cipher=settings.token_cipher()),
        config=settings.runtime_config(),
        gate=BudgetGate(sessions, settings.default_budget(), settings.budget_at_run),
    )
    try:
        await serve_worker(PROG, settings, engine, runtime)
    finally:
        await github.aclose()
        await ai.aclose()
        await engine.dispose()


def main(argv: Sequence[str] | None = None) -> None:
    cli.parse(PROG, __doc__ or "", distribution="san-ai-worker", argv=argv)
    cli.run(PROG, amain(load_settings(AiWorkerSettings)))


if __name__ == "__main__":
    main()
