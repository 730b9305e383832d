"""`san-github-worker`: consumes TIL_GITHUB_COMMIT, on its own queue and pool.

Configured by the environment (DATABASE_URL, AMQP_URL, GITHUB_*, WORKER_*; see
docs/operations.md). Exits 1 with one line when PostgreSQL or RabbitMQ cannot be reached
at start-up."""

from __future__ import annotations

from collections.abc import Sequence

from san_common import cli
from san_common.broker.topology import Topology
from san_common.db.engine import create_session_factory
from san_common.settings import load_settings
from san_common.worker import WorkerRuntime
from san_common.worker.service import serve_worker
from san_github_worker.handlers import build_handlers
from san_github_worker.locks import UserLocks
from san_github_worker.settings import GithubWorkerSettings

PROG = "san-github-worker"


async def amain(settings: GithubWorkerSettings) -> None:
    # Each in-flight job may hold one connection for its per-user lock besides its queries.
    engine = settings.database_engine(pool_size=2 * settings.worker_prefetch + 2)
    github = settings.github_client(settings.quotas(engine))
    runtime = WorkerRuntime(
        session_factory=create_session_factory(engine),
        amqp_url=settings.amqp_url,
        topology=Topology(settings.amqp_prefix),
        handlers=build_handlers(github, settings.token_cipher(), UserLocks(engine)),
        config=settings.runtime_config(),
    )
    try:
        await serve_worker(PROG, settings, engine, runtime)
    finally:
        await github.aclose()
        await engine.dispose()


def main(argv: Sequence[str] | None = None) -> None:
    cli.parse(PROG, __doc__ or "", distribution="san-github-worker", argv=argv)
    cli.run(PROG, amain(load_settings(GithubWorkerSettings)))


if __name__ == "__main__":
    main()
