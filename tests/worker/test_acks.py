"""The worker's acks (`worker/consumer.py` `AmqpDelivery.ack`): the jobs that finish
together each settle their own delivery only. Real RabbitMQ: what the broker redelivers
after the connection is gone is what was not acked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from aio_pika.exceptions import ChannelInvalidStateError

from san_common.worker.consumer import AmqpDelivery
from tests import infra
from tests.waiting import eventually


@pytest.fixture
async def queue_name(amqp_url: str) -> AsyncIterator[str]:
    name = infra.unique_name("santest_acks")
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        yield name
        await channel.queue_delete(name)
    finally:
        await connection.close()


async def _publish(amqp_url: str, queue: str, bodies: list[bytes]) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        for body in bodies:
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
    finally:
        await connection.close()


async def _deliveries(queue: AbstractQueue, count: int) -> list[AbstractIncomingMessage]:
    received: list[AbstractIncomingMessage] = []
    arrived = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        received.append(message)
        if len(received) == count:
            arrived.set()

    await queue.consume(on_message)
    await asyncio.wait_for(arrived.wait(), timeout=10)
    return sorted(received, key=lambda m: m.body)


async def _left_in(amqp_url: str, queue: str, expected: int) -> list[bytes]:
    """The bodies the broker holds once it has taken back what was not acked: a closed
    channel's unacked deliveries return to the queue together, so once `expected` are
    ready, every one that is coming back is."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()

        async def returned() -> bool:
            declared = await channel.declare_queue(queue, passive=True)
            return (declared.declaration_result.message_count or 0) >= expected

        await eventually(returned, within=10, what=f"{expected} deliveries back in the queue")
        declared = await channel.declare_queue(queue, passive=True)
        bodies: list[bytes] = []
        while (message := await declared.get(no_ack=True, fail=False)) is not None:
            bodies.append(message.body)
        return sorted(bodies)
    finally:
        await connection.close()


async def test_acks_asked_together_each_settle_their_own_delivery_only(
    amqp_url: str, queue_name: str
) -> None:
    bodies = [b"job-%d" % i for i in range(6)]
    await _publish(amqp_url, queue_name, bodies)
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=10)
    queue = await channel.declare_queue(queue_name, passive=True)
    messages = await _deliveries(queue, len(bodies))
    deliveries = [AmqpDelivery(m, channel.default_exchange, "test", queue_name) for m in messages]

    # the later deliveries finish together while the first two still run: an ack of a
    # later tag must not settle the earlier ones (`multiple` would)
    await asyncio.gather(*(d.ack() for d in deliveries[2:]))
    await connection.close()  # the two still running go back to the queue

    assert await _left_in(amqp_url, queue_name, expected=2) == [b"job-0", b"job-1"]


async def test_an_ack_on_a_closed_channel_fails_and_the_broker_redelivers(
    amqp_url: str, queue_name: str
) -> None:
    await _publish(amqp_url, queue_name, [b"job-0"])
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    queue = await channel.declare_queue(queue_name, passive=True)
    (message,) = await _deliveries(queue, 1)
    delivery = AmqpDelivery(message, channel.default_exchange, "test", queue_name)
    await channel.close()

    with pytest.raises(ChannelInvalidStateError):
        await delivery.ack()
    await connection.close()
    assert await _left_in(amqp_url, queue_name, expected=1) == [b"job-0"]
