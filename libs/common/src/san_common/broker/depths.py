"""Read a queue's depth for a process that publishes nothing (the maintenance service's
stranded-message check): one long-lived connection, a passive declare per read. It never
declares, re-creates or purges a queue, and never publishes."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aio_pika.abc import AbstractChannel, AbstractRobustChannel, AbstractRobustConnection
from aiormq.exceptions import ChannelNotFoundEntity

from san_common.broker.connect import connect_robust
from san_common.broker.monitor import connection_is_open
from san_common.broker.topology import bulk_lane_of
from san_common.dependencies import quiet_logger

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Depth:
    """Messages ready in a queue (not those delivered and not yet acked), and how many
    consumers it has, as the broker answered a passive declare."""

    ready: int
    consumers: int


class QueueDepths:
    def __init__(self, amqp_url: str) -> None:
        self._url = amqp_url
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None

    async def read(self, queue: str) -> Depth | None:
        """The queue's depth; None when the queue does not exist. Raises when the broker
        cannot be reached (the caller skips this round)."""
        channel = await self._open_channel()
        try:
            async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                # not robust: a robust channel answers a passive declare of a queue it
                # declared before from its cache, with the depth of that first read
                declared = await channel.declare_queue(queue, passive=True, robust=False)
        except ChannelNotFoundEntity:  # a passive declare of a missing queue closes the channel
            self._channel = None
            return None
        result = declared.declaration_result
        return Depth(ready=result.message_count or 0, consumers=result.consumer_count or 0)

    async def read_job_queue(self, queue: str) -> Depth | None:
        """A job queue's depth with its bulk lane's ready messages added (a job's message
        waits in either: topology.py); None when the queue does not exist."""
        depth = await self.read(queue)
        if depth is None:
            return None
        lane = await self.read(bulk_lane_of(queue))
        return Depth(ready=depth.ready + (lane.ready if lane else 0), consumers=depth.consumers)

    async def _open_channel(self) -> AbstractRobustChannel:
        if self._connection is None:
            with quiet_logger("aiormq.connection"):  # the caller reports the outage once
                self._connection = await connect_robust(self._url, connect_timeout=5)
        if not connection_is_open(self._connection):
            raise ConnectionError("the broker connection is reconnecting")
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel()
        return self._channel

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()


async def read_depth(channel: AbstractChannel, queue: str) -> Depth:
    """A passive declare of `queue` on any channel, sent to the broker every time (a robust
    channel's own `declare_queue(passive=True)` answers a queue it declared before from its
    cache, with the counts of that first declare)."""
    underlay = await channel.get_underlay_channel()
    result = await underlay.queue_declare(queue, passive=True)
    return Depth(ready=result.message_count or 0, consumers=result.consumer_count or 0)
