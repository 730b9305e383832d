"""Dramatiq on RabbitMQ: one worker process with its default 8 threads (`--processes 1`);
it acks after the job by default."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence

import asyncpg
import dramatiq
import psycopg
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from benchmarks.peers.common import NOOP_UPDATE_PSYCOPG, cli, spawn

QUEUE = "bench_dramatiq"
_local = threading.local()


def thread_connection(database_url: str) -> psycopg.Connection:  # type: ignore[type-arg]
    """The worker thread's own connection (autocommit), opened on its first use."""
    connection = getattr(_local, "connection", None)
    if connection is None:
        connection = _local.connection = psycopg.connect(database_url, autocommit=True)
    return connection


def setup(
    database_url: str,
    amqp_url: str,
    broker: type[RabbitmqBroker] = RabbitmqBroker,
    queue: str = QUEUE,
    middleware: Sequence[dramatiq.Middleware] = (),
    **options: object,
) -> dramatiq.Actor:  # type: ignore[type-arg]
    instance = broker(url=amqp_url, **options)
    for extra in middleware:
        instance.add_middleware(extra)
    dramatiq.set_broker(instance)

    @dramatiq.actor(queue_name=queue, max_retries=0)
    def noop(row_id: str) -> None:
        entered = time.time()
        thread_connection(database_url).execute(NOOP_UPDATE_PSYCOPG, (entered, uuid.UUID(row_id)))

    return noop


class DramatiqPeer:
    # what the dramatiq CLI imports in the worker (the driver itself runs as __main__)
    module = "benchmarks.peers.dramatiq_peer"
    queue = QUEUE

    def __init__(self, database_url: str, amqp_url: str) -> None:
        self.database_url = database_url
        self.amqp_url = amqp_url
        self.noop = self.setup()

    def setup(self) -> dramatiq.Actor:  # type: ignore[type-arg]
        return setup(self.database_url, self.amqp_url)

    async def prepare(self, connection: asyncpg.Connection) -> None:
        broker = dramatiq.get_broker()
        broker.declare_queue(self.queue)
        broker.flush(self.queue)

    def start_worker(self) -> subprocess.Popen[bytes]:
        return spawn(
            [
                sys.executable,
                "-m",
                "dramatiq",
                "--processes",
                "1",
                "--threads",
                os.environ.get("BENCH_DRAMATIQ_THREADS", "8"),
                self.module,
            ],
            env={
                "BENCH_DATABASE_URL": self.database_url,
                "BENCH_AMQP_URL": self.amqp_url,
                "BENCH_DRAMATIQ_MODULE": self.module,
            },
        )

    async def enqueue(self, row_id: uuid.UUID) -> None:
        self.noop.send(str(row_id))

    async def settle_backlog(self, connection: asyncpg.Connection) -> None:
        return None

    def side_processes(self) -> dict[str, list[int]]:
        return {}

    async def close(self) -> None:
        dramatiq.get_broker().close()

    def worker_main(self) -> None:
        raise SystemExit("the dramatiq CLI runs the worker")


if __name__ == "__main__":
    cli(DramatiqPeer)
elif os.environ.get("BENCH_DRAMATIQ_MODULE") == __name__:  # the dramatiq CLI's worker
    setup(os.environ["BENCH_DATABASE_URL"], os.environ["BENCH_AMQP_URL"])
