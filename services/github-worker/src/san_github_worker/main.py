"""`san-github-worker`: consumes TIL_GITHUB_COMMIT, on its own queue and pool."""

from __future__ import annotations

import asyncio

from san_common.broker.topology import Topology
from san_common.crypto import TokenCipher
from san_common.db.engine import create_engine, create_session_factory
from san_common.github import GithubClient
from san_common.process import readiness, serve
from san_common.worker import RuntimeConfig, WorkerRuntime
from san_github_worker.handlers import build_handlers
from san_github_worker.locks import UserLocks
from san_github_worker.settings import GithubWorkerSettings


async def amain(settings: GithubWorkerSettings) -> None:
    # Each in-flight job may hold one connection for its per-user lock besides its queries.
    engine = create_engine(settings.database_url, pool_size=2 * settings.worker_prefetch + 2)
    github = GithubClient(settings.github_api_url, timeout_seconds=settings.github_timeout_seconds)
    runtime = WorkerRuntime(
        session_factory=create_session_factory(engine),
        amqp_url=settings.amqp_url,
        topology=Topology(settings.amqp_prefix),
        handlers=build_handlers(
            github, TokenCipher.from_setting(settings.token_encryption_keys), UserLocks(engine)
        ),
        config=RuntimeConfig(
            prefetch=settings.worker_prefetch,
            lease_seconds=settings.worker_lease_seconds,
            max_tries=settings.worker_max_tries,
            backoff_seconds=settings.worker_backoff_seconds,
            drain_seconds=settings.worker_drain_seconds,
            rate_limit_waits=settings.worker_rate_limit_waits,
            max_retry_after_seconds=settings.worker_max_retry_after_seconds,
        ),
    )
    try:
        await serve(settings, runtime.run, readiness(engine, settings.amqp_url))
    finally:
        await github.aclose()
        await engine.dispose()


def main() -> None:
    asyncio.run(amain(GithubWorkerSettings()))


if __name__ == "__main__":
    main()
