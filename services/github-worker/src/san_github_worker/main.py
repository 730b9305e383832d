"""`san-github-worker`: consumes TIL_GITHUB_COMMIT, on its own queue and pool."""

from __future__ import annotations

import asyncio

from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.process import readiness, serve
from san_common.settings import load_settings
from san_common.worker import WorkerRuntime
from san_github_worker.handlers import build_handlers
from san_github_worker.locks import UserLocks
from san_github_worker.settings import GithubWorkerSettings


async def amain(settings: GithubWorkerSettings) -> None:
    # Each in-flight job may hold one connection for its per-user lock besides its queries.
    engine = create_engine(settings.database_url, pool_size=2 * settings.worker_prefetch + 2)
    github = settings.github_client()
    runtime = WorkerRuntime(
        session_factory=create_session_factory(engine),
        amqp_url=settings.amqp_url,
        topology=Topology(settings.amqp_prefix),
        handlers=build_handlers(github, settings.token_cipher(), UserLocks(engine)),
        config=settings.runtime_config(),
    )
    try:
        await serve(settings, runtime.run, readiness(engine, settings.amqp_url))
    finally:
        await github.aclose()
        await engine.dispose()


def main() -> None:
    asyncio.run(amain(load_settings(GithubWorkerSettings)))


if __name__ == "__main__":
    main()
