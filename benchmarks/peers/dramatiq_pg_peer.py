"""The like-for-like peer: Dramatiq used the way an application like SAN would use it.
Durable on the broker as SAN is (a quorum queue, every enqueue waiting for its publisher
confirm: `dramatiq_durable_peer`), and keeping a job status row in PostgreSQL as SAN keeps
its job row: the enqueuer inserts it (committed before the message is sent, as SAN's
registration commits before its relay publishes), and a Dramatiq middleware marks it
running when the worker starts the job and done (or failed) when it finishes, each in a
statement of its own on the worker thread's connection.

What SAN does besides, and this peer does not: the outbox (a message is never lost
between the commit and the publish), the fenced lease on each attempt, the result
committed with the outcome. Run with `make bench` beside the plain peers."""

from __future__ import annotations

import os
import uuid
from typing import Any

import asyncpg
import dramatiq
import psycopg

from benchmarks.peers.common import cli
from benchmarks.peers.dramatiq_durable_peer import DramatiqDurablePeer, QuorumRabbitmqBroker
from benchmarks.peers.dramatiq_peer import setup, thread_connection

QUEUE = "bench_dramatiq_pg"
STATUS_DDL = """
CREATE TABLE IF NOT EXISTS bench_job_status (
    id uuid PRIMARY KEY,
    status text NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
)
"""
ENQUEUED = "INSERT INTO bench_job_status (id, status) VALUES (%s, 'queued')"
STARTED = "UPDATE bench_job_status SET status = 'running', started_at = now() WHERE id = %s"
FINISHED = "UPDATE bench_job_status SET status = %s, finished_at = now() WHERE id = %s"


class JobStatus(dramatiq.Middleware):
    """The status row's two transitions in the worker, through Dramatiq's public
    middleware hooks (called on the worker thread that runs the message)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        thread_connection(self.database_url).execute(STARTED, (uuid.UUID(message.args[0]),))

    def after_process_message(
        self, broker: dramatiq.Broker, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        status = "done" if exception is None else "failed"
        thread_connection(self.database_url).execute(FINISHED, (status, uuid.UUID(message.args[0])))


def pg_setup(database_url: str, amqp_url: str) -> dramatiq.Actor:  # type: ignore[type-arg]
    return setup(
        database_url,
        amqp_url,
        QuorumRabbitmqBroker,
        QUEUE,
        middleware=[JobStatus(database_url)],
        confirm_delivery=True,
    )


class DramatiqPgPeer(DramatiqDurablePeer):
    module = "benchmarks.peers.dramatiq_pg_peer"
    queue = QUEUE

    def __init__(self, database_url: str, amqp_url: str) -> None:
        super().__init__(database_url, amqp_url)
        self._enqueuer: psycopg.Connection[Any] | None = None

    def setup(self) -> dramatiq.Actor:  # type: ignore[type-arg]
        return pg_setup(self.database_url, self.amqp_url)

    async def prepare(self, connection: asyncpg.Connection) -> None:
        await connection.execute(STATUS_DDL)
        await connection.execute("TRUNCATE bench_job_status")
        await super().prepare(connection)

    async def enqueue(self, row_id: uuid.UUID) -> None:
        # The row first, committed: a job the worker starts always has its row.
        if self._enqueuer is None:
            self._enqueuer = psycopg.connect(self.database_url, autocommit=True)
        self._enqueuer.execute(ENQUEUED, (row_id,))
        await super().enqueue(row_id)

    async def close(self) -> None:
        if self._enqueuer is not None:
            self._enqueuer.close()
        await super().close()


if __name__ == "__main__":
    cli(DramatiqPgPeer)
elif os.environ.get("BENCH_DRAMATIQ_MODULE") == __name__:  # the dramatiq CLI's worker
    pg_setup(os.environ["BENCH_DATABASE_URL"], os.environ["BENCH_AMQP_URL"])
