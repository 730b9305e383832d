"""`san-ai-worker`: consumes the AI job types."""

from __future__ import annotations

import asyncio

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_ai_worker.settings import AiWorkerSettings
from san_common.broker.topology import Topology
from san_common.crypto import TokenCipher
from san_common.db.engine import create_engine, create_session_factory
from san_common.github import GithubClient
from san_common.process import readiness, serve
from san_common.worker import RuntimeConfig, WorkerRuntime


async def amain(settings: AiWorkerSettings) -> None:
    engine = create_engine(settings.database_url, pool_size=settings.worker_prefetch + 2)
    ai = build_provider(
        settings.ai_provider,
        base_url=settings.ai_base_url,
        api_key=settings.ai_api_key,
        chat_model=settings.ai_chat_model,
        embedding_model=settings.ai_embedding_model,
        timeout_seconds=settings.ai_timeout_seconds,
    )
    github = GithubClient(settings.github_api_url, timeout_seconds=settings.github_timeout_seconds)
    runtime = WorkerRuntime(
        session_factory=create_session_factory(engine),
        amqp_url=settings.amqp_url,
        topology=Topology(settings.amqp_prefix),
        handlers=build_handlers(
            ai, github=github, cipher=TokenCipher.from_setting(settings.token_encryption_keys)
        ),
        config=RuntimeConfig(
            prefetch=settings.worker_prefetch,
            lease_seconds=settings.worker_lease_seconds,
            max_tries=settings.worker_max_tries,
            backoff_seconds=settings.worker_backoff_seconds,
            drain_seconds=settings.worker_drain_seconds,
        ),
    )
    try:
        await serve(settings, runtime.run, readiness(engine, settings.amqp_url))
    finally:
        await github.aclose()
        await ai.aclose()
        await engine.dispose()


def main() -> None:
    asyncio.run(amain(AiWorkerSettings()))


if __name__ == "__main__":
    main()
