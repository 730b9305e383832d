"""Dramatiq made as durable on the broker as SAN: a quorum queue, and every enqueue waits
for the broker's publisher confirm (`confirm_delivery=True`). Not one of issue 13's peers
(those run with their defaults, `dramatiq_peer`); reported beside them with
`make bench BENCH_ARGS="--systems san dramatiq dramatiq_durable"`, to show what the
broker-side half of SAN's guarantees costs a RabbitMQ peer on this machine."""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from benchmarks.peers.common import cli
from benchmarks.peers.dramatiq_peer import DramatiqPeer, setup

QUEUE = "bench_dramatiq_quorum"


class QuorumRabbitmqBroker(RabbitmqBroker):
    """Dramatiq's broker with its queue and its delay queue declared as quorum queues (the
    dead-letter queue, which only ever holds failed messages, stays as Dramatiq makes it)."""

    def _build_queue_arguments(self, queue_name: str) -> dict[str, Any]:
        return {**super()._build_queue_arguments(queue_name), "x-queue-type": "quorum"}


def durable_setup(database_url: str, amqp_url: str) -> dramatiq.Actor:  # type: ignore[type-arg]
    return setup(database_url, amqp_url, QuorumRabbitmqBroker, QUEUE, confirm_delivery=True)


class DramatiqDurablePeer(DramatiqPeer):
    module = "benchmarks.peers.dramatiq_durable_peer"
    queue = QUEUE

    def setup(self) -> dramatiq.Actor:  # type: ignore[type-arg]
        return durable_setup(self.database_url, self.amqp_url)


if __name__ == "__main__":
    cli(DramatiqDurablePeer)
elif os.environ.get("BENCH_DRAMATIQ_MODULE") == __name__:  # the dramatiq CLI's worker
    durable_setup(os.environ["BENCH_DATABASE_URL"], os.environ["BENCH_AMQP_URL"])
