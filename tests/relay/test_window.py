"""The relay's windows as measured on a real queue: the consumer term, and the throughput
term — the window holds what the consumers took in the last `RELAY_WINDOW_SECONDS`, and
only that long (a window left at a busy spell's size would let the next user's backlog
into the queue whole, ahead of everyone after it: docs/architecture.md, "Fair share and
priorities")."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection

from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from san_relay.window import Windows

pytestmark = pytest.mark.rabbit

HORIZON = 0.5  # RELAY_WINDOW_SECONDS of these tests
LEAST, PER_CONSUMER = 10, 5


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[AbstractConnection]:
    connection = await aio_pika.connect(amqp_url)
    yield connection
    await connection.close()


def _windows(topology: Topology) -> Windows:
    return Windows(
        topology, least=LEAST, per_consumer=PER_CONSUMER, seconds=HORIZON, poll_seconds=0.01
    )


async def _fill(connection: AbstractConnection, queue: str, count: int) -> None:
    channel = await connection.channel(publisher_confirms=True)
    for n in range(count):
        await channel.default_exchange.publish(aio_pika.Message(b"%d" % n), routing_key=queue)
    await channel.close()


async def _take(connection: AbstractConnection, queue: str, count: int) -> None:
    """A consumer's worth of deliveries, acked: what the window counts as taken."""
    channel = await connection.channel()
    source = await channel.get_queue(queue, ensure=False)
    for _ in range(count):
        message = await source.get(fail=True)
        assert message is not None
        await message.ack()
    await channel.close()


def _window_of(windows: Windows, queue: str) -> int:
    return windows.state()[queue][0]


async def test_the_window_holds_what_the_consumers_took_within_its_seconds(
    topology: Topology, connection: AbstractConnection
) -> None:
    queue = topology.queue_name(JobType.CARD_ANALYSIS)
    windows = _windows(topology)
    await _fill(connection, queue, 200)
    await windows.read(connection, [queue])
    assert _window_of(windows, queue) == LEAST  # nobody consumes, nothing taken yet

    await _take(connection, queue, 120)
    await windows.read(connection, [queue])
    assert _window_of(windows, queue) == 120

    # what the relay admitted since the last read counts as ready, not as taken
    await _fill(connection, queue, 30)
    taken = windows.reserve([str(JobType.CARD_ANALYSIS)] * 30)
    windows.settle(taken, Counter({queue: 30}))
    await windows.read(connection, [queue])
    assert _window_of(windows, queue) == 120

    await asyncio.sleep(HORIZON + 0.1)
    assert _window_of(windows, queue) == LEAST  # aged out, without another read
    assert windows.fits([str(JobType.CARD_ANALYSIS)] * 200) == [queue]


async def test_a_window_without_the_throughput_term_stays_at_its_consumers(
    topology: Topology, connection: AbstractConnection
) -> None:
    queue = topology.queue_name(JobType.CARD_ANALYSIS)
    windows = Windows(
        topology, least=LEAST, per_consumer=PER_CONSUMER, seconds=0, poll_seconds=0.01
    )
    await _fill(connection, queue, 50)
    await windows.read(connection, [queue])
    await _take(connection, queue, 40)
    await windows.read(connection, [queue])
    assert _window_of(windows, queue) == LEAST
