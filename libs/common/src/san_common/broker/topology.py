"""The RabbitMQ topology, declared idempotently by every process that touches the broker.

    {prefix}.jobs      direct exchange; routing key = job type
      └─ {prefix}.jobs.<job_type>   one durable quorum queue per registered job type
      └─ {prefix}.jobs.<job_type>.bulk   its bulk lane (routing key `<job type>.bulk`)
    {prefix}.jobs.dlx  direct exchange receiving dead letters
      └─ {prefix}.jobs.dead-letters the dead-letter queue (classic), bound for every job type
    {prefix}.deployment             held by the deployment running on the prefix (ownership.py)

Dead letters are never dropped: every queue names its dead-letter routing key (its job
type), to which the dead-letter queue is bound; dead-lettering is `at-least-once` (RabbitMQ
≥ 3.10, quorum queues), which needs `overflow: reject-publish`. A worker that gives up on a
message republishes it to the DLX itself, with headers saying why (`x-san-reason`, a
short code, and `x-san-detail`), when (`x-san-dead-lettered-at`) and from which queue
(`x-san-queue`); the broker's own dead-lettering (rejected, expired, delivery limit) adds
`x-death` with the same facts.

The dead-letter queue is a classic queue, so that operators can read it without changing
it: a message taken unacknowledged and given back returns to its own place, unchanged (a
quorum queue would count a delivery in its headers each time, and RabbitMQ 4 puts a
returned message at the back). Dead letters are few, and nothing runs from them.

A job queue's bulk lane holds one user's backlog that nobody else's work waits behind:
the relay publishes into it only while that user is the only one with work due for the
queue, and workers consume both (docs/architecture.md, "Fair share and priorities"). A
message in either is the same job's message; a lane is not a job type of its own.

Quorum queues count deliveries: a message redelivered more than `DELIVERY_LIMIT` times
(a poison message that crashes its consumer) is dead-lettered instead of looping forever.
"""

from __future__ import annotations

from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractQueue
from aiormq.exceptions import ChannelNotFoundEntity

from san_common.jobs import registry

# With the runtime's growing pause before each requeue, 20 deliveries ride out minutes of outage.
DELIVERY_LIMIT = 20
BULK_SUFFIX = ".bulk"
REASON_HEADER = "x-san-reason"
DETAIL_HEADER = "x-san-detail"
DEAD_LETTERED_AT_HEADER = "x-san-dead-lettered-at"
SOURCE_QUEUE_HEADER = "x-san-queue"


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
        return f"{self.prefix}.jobs.dead-letters"

    @property
    def legacy_dead_letter_queue(self) -> str:
        """The quorum dead-letter queue of earlier versions (`adopt_legacy_dead_letters`)."""
        return f"{self.prefix}.jobs.dead"

    @property
    def owner_queue(self) -> str:
        """Held by the deployment running on this prefix (broker/ownership.py)."""
        return f"{self.prefix}.deployment"

    def queue_name(self, job_type: str) -> str:
        return f"{self.prefix}.jobs.{registry.spec_for(job_type).queue}"

    def bulk_queue_name(self, job_type: str) -> str:
        return bulk_lane_of(self.queue_name(job_type))

    def job_queue_names(self) -> list[str]:
        """Every job queue and its bulk lane: where a job's message can wait."""
        names = {self.queue_name(t) for t in registry.job_types()}
        return sorted(names | {bulk_lane_of(n) for n in names})

    def exchange_for(self, logical_name: str) -> str:
        """Outbox rows name a logical exchange (`jobs`); the deployment adds its prefix."""
        return f"{self.prefix}.{logical_name}"

    def all_queue_names(self) -> list[str]:
        return [*self.job_queue_names(), self.dead_letter_queue]


def bulk_routing_key(job_type: str) -> str:
    return f"{job_type}{BULK_SUFFIX}"


def bulk_lane_of(queue: str) -> str:
    """The bulk lane of job queue `queue` (a name `Topology.queue_name` gave)."""
    return f"{queue}{BULK_SUFFIX}"


def queue_arguments(topology: Topology, job_type: str) -> dict[str, object]:
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": topology.dead_letter_exchange,
        "x-dead-letter-routing-key": str(job_type),
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-delivery-limit": DELIVERY_LIMIT,
    }


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
) -> dict[str, AbstractQueue]:
    """Declare exchanges and every queue; safe to run concurrently from many processes."""
    jobs = await declare_exchanges(channel, topology)
    dead = await channel.declare_queue(
        topology.dead_letter_queue, durable=True, arguments={"x-queue-type": "classic"}
    )
    queues: dict[str, AbstractQueue] = {}
    for job_type in registry.job_types():
        arguments = queue_arguments(topology, job_type)
        queue = await channel.declare_queue(
            topology.queue_name(job_type),
            durable=True,
            arguments=arguments,  # type: ignore[arg-type]
        )
        await queue.bind(jobs, routing_key=job_type)
        bulk = await channel.declare_queue(
            topology.bulk_queue_name(job_type),
            durable=True,
            arguments=arguments,  # type: ignore[arg-type]
        )
        await bulk.bind(jobs, routing_key=bulk_routing_key(job_type))
        await dead.bind(topology.dead_letter_exchange, routing_key=job_type)
        queues[job_type] = queue
    return queues


async def adopt_legacy_dead_letters(connection: AbstractConnection, topology: Topology) -> int:
    """Move the dead letters of an earlier version's quorum dead-letter queue to the
    current one, which `declare_topology` made (each confirmed before it is acked); unbind
    it first, so that it receives no more, and delete it once empty. Returns how many
    moved; 0 where there is no such queue. Safe to run from several processes at once:
    each message is taken by one of them."""
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        try:
            legacy = await channel.declare_queue(topology.legacy_dead_letter_queue, passive=True)
        except ChannelNotFoundEntity:
            return 0  # the channel is closed by the refusal
        for job_type in registry.job_types():
            await legacy.unbind(topology.dead_letter_exchange, routing_key=job_type)
        moved = 0
        while (message := await legacy.get(no_ack=False, fail=False)) is not None:
            await channel.default_exchange.publish(
                aio_pika.Message(
                    body=message.body,
                    headers=dict(message.headers or {}),
                    content_type=message.content_type,
                    message_id=message.message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    timestamp=message.timestamp,
                    type=message.type,
                ),
                routing_key=topology.dead_letter_queue,
                mandatory=True,  # the current queue must exist (declared before this runs)
            )
            await message.ack()
            moved += 1
        # Unbound above, so nothing arrives any more (quorum queues refuse `if_empty`).
        await legacy.delete(if_unused=False, if_empty=False)
        return moved
    finally:
        if not channel.is_closed:
            await channel.close()
