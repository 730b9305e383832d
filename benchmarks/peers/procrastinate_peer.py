"""procrastinate (PostgreSQL): one worker process, `concurrency=10` (like SAN's prefetch 10),
LISTEN/NOTIFY on (its default)."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid

import asyncpg
import procrastinate
from psycopg_pool import AsyncConnectionPool

from benchmarks.peers.common import NOOP_UPDATE_PSYCOPG, cli, spawn, worker_command

QUEUE = "bench"


class ProcrastinatePeer:
    def __init__(self, database_url: str, amqp_url: str) -> None:
        self.database_url = database_url
        self.amqp_url = amqp_url
        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=database_url)
        )
        self.pool: AsyncConnectionPool | None = None

        @self.app.task(name="noop", queue=QUEUE)
        async def noop(row_id: str) -> None:
            entered = time.time()
            assert self.pool is not None
            async with self.pool.connection() as connection:
                await connection.execute(NOOP_UPDATE_PSYCOPG, (entered, uuid.UUID(row_id)))

        self.noop = noop
        self._opened = False

    async def _open(self) -> None:
        if not self._opened:
            await self.app.open_async()
            self._opened = True

    async def prepare(self, connection: asyncpg.Connection) -> None:
        installed = await connection.fetchval("SELECT to_regclass('procrastinate_jobs')")
        await self._open()
        if installed is None:
            await self.app.schema_manager.apply_schema_async()
        await connection.execute("TRUNCATE procrastinate_jobs CASCADE")

    def start_worker(self) -> subprocess.Popen[bytes]:
        return spawn(
            worker_command("benchmarks.peers.procrastinate_peer", self.database_url, self.amqp_url)
        )

    async def enqueue(self, row_id: uuid.UUID) -> None:
        await self._open()
        await self.noop.defer_async(row_id=str(row_id))

    async def settle_backlog(self, connection: asyncpg.Connection) -> None:
        return None

    def side_processes(self) -> dict[str, list[int]]:
        return {}

    async def close(self) -> None:
        if self._opened:
            await self.app.close_async()

    def worker_main(self) -> None:
        async def main() -> None:
            self.pool = AsyncConnectionPool(self.database_url, min_size=2, max_size=10, open=False)
            await self.pool.open()
            async with self.app.open_async():
                await self.app.run_worker_async(queues=[QUEUE], concurrency=10, wait=True)

        asyncio.run(main())


if __name__ == "__main__":
    cli(ProcrastinatePeer)
