"""Celery on RabbitMQ: one worker process (`--pool=solo`: one process, jobs one after the
other, its fastest pool for tiny jobs), `acks_late` (ack after the job, like SAN),
prefetch 10, results ignored."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import asyncpg
import psycopg
from celery import Celery

from benchmarks.peers.common import NOOP_UPDATE_PSYCOPG, cli, spawn

QUEUE = "bench.celery"
_connection: psycopg.Connection | None = None


def make_app(database_url: str, amqp_url: str) -> Celery:
    app = Celery("bench", broker=amqp_url)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=int(os.environ.get("BENCH_CELERY_PREFETCH", "10")),
        task_ignore_result=True,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name="noop")
    def noop(row_id: str) -> None:
        global _connection
        entered = time.time()
        if _connection is None:
            _connection = psycopg.connect(database_url, autocommit=True)
        _connection.execute(NOOP_UPDATE_PSYCOPG, (entered, uuid.UUID(row_id)))

    return app


class CeleryPeer:
    def __init__(self, database_url: str, amqp_url: str) -> None:
        self.database_url = database_url
        self.amqp_url = amqp_url
        self.app = make_app(database_url, amqp_url)

    async def prepare(self, connection: asyncpg.Connection) -> None:
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            channel.queue_declare(QUEUE, durable=True, auto_delete=False)
            channel.queue_purge(QUEUE)

    def start_worker(self) -> subprocess.Popen[bytes]:
        return spawn(
            [
                sys.executable,
                "-m",
                "benchmarks.peers.celery_peer",
                "worker",
                "--database-url",
                self.database_url,
                "--amqp-url",
                self.amqp_url,
            ]
        )

    async def enqueue(self, row_id: uuid.UUID) -> None:
        self.app.send_task("noop", args=[str(row_id)], queue=QUEUE)

    async def settle_backlog(self, connection: asyncpg.Connection) -> None:
        return None

    def side_processes(self) -> dict[str, list[int]]:
        return {}

    async def close(self) -> None:
        self.app.close()

    def worker_main(self) -> None:
        self.app.worker_main(
            [
                "worker",
                "--pool=solo",
                "--loglevel=WARNING",
                "-Q",
                QUEUE,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )


if __name__ == "__main__":
    cli(CeleryPeer)
