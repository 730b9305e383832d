"""The RabbitMQ topology, declared idempotently by every process that touches the broker.

    {prefix}.jobs      direct exchange; routing key = job type
      └─ {prefix}.jobs.<job_type>   one durable quorum queue per job type
    {prefix}.jobs.dlx  direct exchange receiving rejected / over-delivered messages
      └─ {prefix}.jobs.dead         the dead-letter queue, bound for every job type

Quorum queues count deliveries: a message redelivered more than `DELIVERY_LIMIT` times
(a poison message that crashes its consumer) is dead-lettered instead of looping forever.
"""

from __future__ import annotations

from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

from san_common.jobs.types import JobType

# With the runtime's growing pause before each requeue, 20 deliveries ride out minutes of outage.
DELIVERY_LIMIT = 20


@dataclass(frozen=True)
class Topology:
    prefix: str = "san"

    @property
    def jobs_exchange(self) -> str:
        return f"{self.prefix}.jobs"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.prefix}.jobs.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.prefix}.jobs.dead"

    def queue_name(self, job_type: JobType) -> str:
        return f"{self.prefix}.jobs.{job_type.value.lower()}"

    def exchange_for(self, logical_name: str) -> str:
        """Outbox rows name a logical exchange (`jobs`); the deployment adds its prefix."""
        return f"{self.prefix}.{logical_name}"

    def all_queue_names(self) -> list[str]:
        return [self.queue_name(t) for t in JobType] + [self.dead_letter_queue]


async def declare_exchanges(channel: AbstractChannel, topology: Topology) -> AbstractExchange:
    jobs = await channel.declare_exchange(
        topology.jobs_exchange, aio_pika.ExchangeType.DIRECT, durable=True
    )
    await channel.declare_exchange(
        topology.dead_letter_exchange, aio_pika.ExchangeType.DIRECT, durable=True
    )
    return jobs


async def declare_topology(
    channel: AbstractChannel, topology: Topology
) -> dict[JobType, AbstractQueue]:
    """Declare exchanges and every queue; safe to run concurrently from many processes."""
    jobs = await declare_exchanges(channel, topology)
    dead = await channel.declare_queue(
        topology.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
    )
    queues: dict[JobType, AbstractQueue] = {}
    for job_type in JobType:
        queue = await channel.declare_queue(
            topology.queue_name(job_type),
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": topology.dead_letter_exchange,
                "x-delivery-limit": DELIVERY_LIMIT,
            },
        )
        await queue.bind(jobs, routing_key=job_type.value)
        await dead.bind(topology.dead_letter_exchange, routing_key=job_type.value)
        queues[job_type] = queue
    return queues
