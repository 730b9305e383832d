"""pgqueuer (PostgreSQL): one worker process (`QueueManager.run`, batch size 10, or
`BENCH_PGQUEUER_BATCH`), LISTEN/NOTIFY on (its default)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Job

from benchmarks.peers.common import NOOP_UPDATE, cli, spawn, worker_command

ENTRYPOINT = "noop"


class PgqueuerPeer:
    def __init__(self, database_url: str, amqp_url: str) -> None:
        self.database_url = database_url
        self.amqp_url = amqp_url
        self._connection: asyncpg.Connection | None = None
        self._queries: Queries | None = None

    async def _enqueuer(self) -> Queries:
        if self._queries is None:
            self._connection = await asyncpg.connect(self.database_url)
            self._queries = Queries(AsyncpgDriver(self._connection))
        return self._queries

    async def prepare(self, connection: asyncpg.Connection) -> None:
        installed = await connection.fetchval("SELECT to_regclass('pgqueuer')")
        if installed is None:
            await Queries(AsyncpgDriver(connection)).install()
        await connection.execute("TRUNCATE pgqueuer, pgqueuer_log")

    def start_worker(self) -> subprocess.Popen[bytes]:
        return spawn(
            worker_command("benchmarks.peers.pgqueuer_peer", self.database_url, self.amqp_url)
        )

    async def enqueue(self, row_id: uuid.UUID) -> None:
        await (await self._enqueuer()).enqueue(ENTRYPOINT, row_id.bytes)

    async def settle_backlog(self, connection: asyncpg.Connection) -> None:
        return None

    def side_processes(self) -> dict[str, list[int]]:
        return {}

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()

    def worker_main(self) -> None:
        async def main() -> None:
            connection = await asyncpg.connect(self.database_url)
            batch_size = int(os.environ.get("BENCH_PGQUEUER_BATCH", "10"))
            # the jobs of a batch run at once, each on a connection of this pool
            pool = await asyncpg.create_pool(
                self.database_url, min_size=min(2, batch_size), max_size=batch_size
            )
            manager = QueueManager(Queries(AsyncpgDriver(connection)))

            @manager.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                entered = time.time()
                assert job.payload is not None
                await pool.execute(NOOP_UPDATE, uuid.UUID(bytes=job.payload), entered)

            await manager.run(batch_size=batch_size)

        asyncio.run(main())


if __name__ == "__main__":
    cli(PgqueuerPeer)
