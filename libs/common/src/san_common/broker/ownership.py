"""Which deployment a queue prefix belongs to, held on the broker while it runs.

Every process that consumes or publishes job messages (workers, relays) declares the queue
`{prefix}.deployment` with the deployment's id in its `x-dead-letter-exchange` argument,
and keeps a consumer on it; it never holds a message. RabbitMQ refuses, atomically, to
declare an existing queue with a different value of that argument (PRECONDITION_FAILED):
so a process of another deployment starting on the same prefix is refused before it
consumes or publishes anything, whichever of the two started first. The queue expires
`OWNER_EXPIRES_SECONDS` after its last consumer leaves, so a prefix is free again shortly
after its deployment stops, however it stopped (a SIGKILL included), and a restart of the
same deployment is never refused.
"""

from __future__ import annotations

import re

from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aiormq.exceptions import ChannelPreconditionFailed

from san_common.broker.topology import Topology
from san_common.cli import StartupRefused

OWNER_EXPIRES_SECONDS = 30


class PrefixInUse(StartupRefused):
    """Another deployment holds this prefix."""


def owner_arguments(topology: Topology, deployment_id: str) -> dict[str, object]:
    return {
        "x-expires": OWNER_EXPIRES_SECONDS * 1000,
        # Never used for dead-lettering (the queue holds nothing): the one free-form
        # argument RabbitMQ compares on every declare. Just the id, so that the refusal
        # (whose text RabbitMQ cuts at 255 bytes) still names the holder.
        "x-dead-letter-exchange": deployment_id,
    }


async def hold_prefix(
    connection: AbstractConnection, topology: Topology, deployment_id: str
) -> AbstractChannel:
    """Declare this deployment the prefix's owner and hold it for as long as the returned
    channel stays open (a robust connection declares it again after a reconnect). Raises
    `PrefixInUse` if another deployment holds it."""
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(
            topology.owner_queue,
            durable=False,
            arguments=owner_arguments(topology, deployment_id),  # type: ignore[arg-type]
        )
    except ChannelPreconditionFailed as exc:
        found = re.search(r"current is '([^']+)'", str(exc))
        other = f"deployment {found.group(1)}" if found else "another deployment"
        raise PrefixInUse(
            f"the queues of AMQP_PREFIX={topology.prefix} belong to {other}, which is"
            f" running on them; this is deployment {deployment_id}. Give each deployment"
            " an AMQP_PREFIX or a RabbitMQ vhost of its own (docs/operations.md); a stopped"
            f" deployment frees its prefix within {OWNER_EXPIRES_SECONDS} s"
        ) from None
    await queue.consume(_never_called, no_ack=True)
    return channel


async def _never_called(message: AbstractIncomingMessage) -> None:
    """Nothing publishes to the owner queue; a stray message is dropped (no_ack)."""
