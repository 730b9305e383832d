"""SAN through the same harness: jobs registered by SAN's own registration path (job row +
outbox row in one statement: `register_job`, and the API's direct publisher publishing a
user's first active job right after the commit), the
rest published by a real `san-relay` process,
run by SAN's `WorkerRuntime` in a worker process of its own with a no-op handler (the
same one-row UPDATE as every peer's job; the runtime around it is the real one).

Runs in SAN's virtual environment."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import ClassVar

import aio_pika
import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from benchmarks.peers.common import cli, spawn
from san_common import deployment
from san_common.broker.direct import DirectPublisher
from san_common.broker.monitor import BrokerMonitor
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory, plain_url
from san_common.jobs import publishing
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, Write

# `make bench` names a prefix per run (benchmarks/run.py), so two benches at once never
# share one, which the deployment-ownership guard would refuse.
PREFIX = os.environ.get("BENCH_SAN_PREFIX", "sanbench")
JOB_TYPE = JobType.SCRAP_REFINE  # any type: the benchmark's worker serves only this queue
NOOP = text(
    "UPDATE bench_rows SET started_at = to_timestamp(:entered), done_at = clock_timestamp() "
    "WHERE id = :id"
)


class NoopHandler(JobHandler[None, float]):
    """A job that updates one row, like every peer's: `run` notes when the job started,
    `write` is the UPDATE (the jobs completing together share one executemany).
    Its job row is all it needs, so it has no `load` (and the runtime no load transaction),
    as a peer's job function reads nothing before it starts."""

    job_type: ClassVar[JobType] = JOB_TYPE

    async def run(self, job: AsyncJob, payload: None) -> float:
        return time.time()

    def write(self, job: AsyncJob, entered: float) -> Write:
        return Write(NOOP, {"entered": entered, "id": job.target_id})


def _service_env(database_url: str, amqp_url: str) -> dict[str, str]:
    prefetch = os.environ.get("BENCH_SAN_PREFETCH", "50")
    return {
        "DATABASE_URL": database_url,
        "AMQP_URL": amqp_url,
        "AMQP_PREFIX": PREFIX,
        "SAN_ENV": "development",
        "DATA_DIR": os.environ.get("BENCH_LOG_DIR", "/tmp"),
        # Jobs at once in the worker process. SAN's default (10) suits AI calls of seconds;
        # for no-op jobs a user raises it, as the Celery driver raises its prefetch
        # multiplier: the runtime's group commit shares each statement among the jobs in
        # flight (docs/performance.md has the figures at 10 too).
        "WORKER_PREFETCH": prefetch,
        # The relay's window per consumer follows the prefetch, as docs/operations.md says
        # to set it (fair share: docs/architecture.md, "Fair share and priorities").
        "RELAY_WINDOW_PER_CONSUMER": prefetch,
        **dict(kv.split("=", 1) for kv in os.environ.get("BENCH_SAN_ENV", "").split() if kv),
    }


async def drop_topology(amqp_url: str, prefix: str = PREFIX) -> None:
    """The prefix's queues and exchanges, deleted: before a scenario so that the relay and
    the worker declare them as this version of SAN does (queue arguments change between
    versions, and a queue redeclared with other arguments is refused), and after the run so
    that a prefix of its own per run leaves nothing behind on the broker."""
    topology = Topology(prefix)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        for name in topology.all_queue_names():
            await channel.queue_delete(name)
        for exchange in (topology.jobs_exchange, topology.dead_letter_exchange):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()


class SanPeer:
    def __init__(self, database_url: str, amqp_url: str) -> None:
        self.database_url = database_url
        self.amqp_url = amqp_url
        self._engine: AsyncEngine | None = None
        self._sessions: async_sessionmaker[AsyncSession] | None = None
        self._user_id: uuid.UUID | None = None
        self._relay: subprocess.Popen[bytes] | None = None
        self._pool: asyncpg.Pool | None = None
        self._monitor: BrokerMonitor | None = None
        self._publisher: DirectPublisher | None = None

    async def prepare(self, connection: asyncpg.Connection) -> None:
        await connection.execute("TRUNCATE async_jobs, outbox_messages CASCADE")
        self._user_id = await connection.fetchval(
            "INSERT INTO users (external_id) VALUES ('bench') "
            "ON CONFLICT (external_id) DO UPDATE SET external_id = excluded.external_id "
            "RETURNING id"
        )
        await drop_topology(self.amqp_url)
        self._engine = create_engine(self.database_url, pool_size=2, pre_ping=False)
        self._sessions = create_session_factory(self._engine)
        relay = Path(sys.executable).with_name("san-relay")
        self._relay = spawn([str(relay)], env=_service_env(self.database_url, self.amqp_url))

    def side_processes(self) -> dict[str, list[int]]:
        """Processes besides the worker whose CPU a job costs (run_scenario counts it)."""
        return {"relay": [self._relay.pid]} if self._relay is not None else {}

    def start_worker(self) -> subprocess.Popen[bytes]:
        return spawn(
            [
                sys.executable,
                "-m",
                "benchmarks.peers.san_peer",
                "worker",
                "--database-url",
                self.database_url,
                "--amqp-url",
                self.amqp_url,
            ],
            env=_service_env(self.database_url, self.amqp_url),
        )

    async def _start_publisher(self) -> None:
        """The API's wiring (services/api/src/san_api/app.py): a broker connection in the
        background, the direct publisher on it, marks on an asyncpg pool."""
        self._pool = await asyncpg.create_pool(plain_url(self.database_url), min_size=1, max_size=4)
        self._monitor = BrokerMonitor(self.amqp_url)
        await self._monitor.start()
        sessions, pool = self._sessions, self._pool
        assert sessions is not None
        self._publisher = DirectPublisher(
            self._monitor,
            Topology(PREFIX),
            deployment_id=lambda: deployment.identity(sessions),
            mark=lambda ids: publishing.mark_published(pool, ids),
            grace_seconds=3.0,
            confirm_seconds=2.0,
        )
        self._publisher.start()
        deadline = time.monotonic() + 30
        while not self._publisher.ready():  # the relay declares the topology meanwhile
            if time.monotonic() > deadline:
                raise RuntimeError("the direct publisher did not get ready")
            await asyncio.sleep(0.05)

    async def enqueue(self, row_id: uuid.UUID) -> None:
        assert self._sessions is not None and self._user_id is not None
        if self._publisher is None:
            await self._start_publisher()
        assert self._publisher is not None
        direct = self._publisher.batch()
        # one statement in autocommit, as every peer enqueues (the API's own registrations
        # join the request's transaction instead: benchmarks/bare_api.py measures those)
        await register_job(
            self._sessions, job_type=JOB_TYPE, target_id=row_id, user_id=self._user_id,
            direct=direct,
        )  # fmt: skip
        if direct is not None:
            self._publisher.submit(direct.rows)

    async def settle_backlog(self, connection: asyncpg.Connection) -> None:
        """Until the relay has published all it will before a worker consumes: every row,
        or (fair share) its window's worth, the rest held in the outbox — where a queued
        job of SAN waits, and what the drain then measures too."""
        seen, since = -1, time.monotonic()
        while True:
            left = await connection.fetchval(
                "SELECT count(*) FROM outbox_messages WHERE published_at IS NULL"
            )
            if left != seen:
                seen, since = left, time.monotonic()
            if left == 0 or time.monotonic() - since > 1.0:
                return
            if self._relay is not None and self._relay.poll() is not None:
                raise RuntimeError("san-relay exited; see its log")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        from benchmarks.peers.common import stop_process

        if self._publisher is not None:
            await self._publisher.close()
        if self._monitor is not None:
            await self._monitor.close()
        if self._pool is not None:
            await self._pool.close()
        if self._relay is not None:
            stop_process(self._relay)
        if self._engine is not None:
            await self._engine.dispose()

    def worker_main(self) -> None:
        from san_common import probes
        from san_common.cli import run
        from san_common.probes import Readiness
        from san_common.process import serve
        from san_common.settings import load_settings
        from san_common.worker import WorkerRuntime
        from san_common.worker.settings import WorkerSettings

        settings = load_settings(WorkerSettings)

        async def main() -> None:
            engine = create_engine(
                settings.database_url,
                pool_size=settings.worker_prefetch + 2,
                pre_ping=False,
                generic_plans=True,
            )
            runtime = WorkerRuntime(
                session_factory=create_session_factory(engine),
                amqp_url=settings.amqp_url,
                topology=Topology(settings.amqp_prefix),
                handlers={JOB_TYPE: NoopHandler()},
                config=settings.runtime_config(),
            )
            try:
                # the same wiring as san-ai-worker's main, with the no-op handler
                ready = Readiness({"database": probes.database(engine)})
                await serve(settings, runtime.run, ready)
            finally:
                await engine.dispose()

        run("san-bench-worker", main())


if __name__ == "__main__":
    cli(SanPeer)
