"""The API's direct publisher: a job's message published by the process that committed it,
right after the commit, with the outbox relay as the fallback (docs/architecture.md,
"Direct publish").

A request registers its rows with `batch()` (None while the publisher cannot publish: the
rows are then registered due at once, for the relay), and hands them to `submit()` once its
transaction has committed. In the background, without delaying the response, each row is
published with a confirm (`san_common.jobs.publishing.publish_row`, as the relay does), and
the confirmed rows are marked published, the marks of concurrent requests in one statement.
A publish that fails, or is not confirmed in time, leaves its row unmarked: the relay
publishes it once its grace has passed. A process killed anywhere in between leaves the
same. Nothing is lost, and a message published twice is harmless (the worker's claim).

The publisher uses the connection of the process's `BrokerMonitor` (opened in the
background: the API starts and serves with the broker away), holds the prefix for its
deployment before it publishes anything (`hold_prefix`, as the relay does) and publishes on
a channel of its own with publisher confirms. A broker outage is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from aio_pika.abc import AbstractChannel, AbstractExchange

from san_common import metrics
from san_common.broker.monitor import BrokerMonitor, connection_is_open
from san_common.broker.ownership import PrefixInUse, hold_prefix
from san_common.broker.topology import Topology, declare_topology
from san_common.cli import describe
from san_common.errors import is_connection_loss
from san_common.jobs.outbox import JOBS_EXCHANGE
from san_common.jobs.publishing import DirectRows, Pending, publish_row
from san_common.outages import DATABASE, Outage

log = logging.getLogger(__name__)

# One per process: the first failed direct publish of an outage is the warning.
DIRECT_PUBLISH = Outage("RabbitMQ (direct publish)")

# Publications in flight at once; beyond it a request's rows wait for a slot, and those
# that wait longer than their grace are published by the relay as well (harmless).
IN_FLIGHT = 64

RETRY_SECONDS = 2.0


class DirectPublisher:
    def __init__(
        self,
        monitor: BrokerMonitor,
        topology: Topology,
        *,
        deployment_id: Callable[[], Awaitable[str]],
        mark: Callable[[Sequence[int]], Awaitable[None]],
        grace_seconds: float,
        confirm_seconds: float,
    ) -> None:
        self._monitor = monitor
        self._topology = topology
        self._deployment_id = deployment_id
        self._mark = mark
        self._grace = grace_seconds
        self._confirm_seconds = confirm_seconds
        self._deployment: str | None = None
        self._channel: AbstractChannel | None = None
        self._exchange: AbstractExchange | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight = asyncio.Semaphore(IN_FLIGHT)
        self._publishing: set[asyncio.Task[None]] = set()
        self._unmarked: list[int] = []
        self._marking = asyncio.Lock()

    def start(self) -> None:
        """Prepare in the background: the deployment's id, the prefix, the channel."""
        self._task = asyncio.create_task(self._prepare())

    def ready(self) -> bool:
        return (
            self._exchange is not None
            and self._channel is not None
            and not self._channel.is_closed
            and connection_is_open(self._monitor.connection)
        )

    def batch(self) -> DirectRows | None:
        """A request's collector of direct rows; None when publishing now would fail anyway
        (the rows are registered due at once)."""
        return DirectRows(self._grace) if self.ready() else None

    def submit(self, rows: Sequence[Pending]) -> None:
        """Publish `rows` (committed) in the background."""
        if not rows:
            return
        task = asyncio.create_task(self._publish(list(rows)))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def close(self) -> None:
        """Stop; what is still publishing is left to the relay's fallback."""
        for task in (self._task, *self._publishing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._channel is not None and not self._channel.is_closed:
            with contextlib.suppress(Exception):
                await self._channel.close()

    async def _prepare(self) -> None:
        while True:
            try:
                await self._open()
                return
            except PrefixInUse as exc:
                # Another deployment's queues: never publish onto them. The relay of this
                # deployment refuses to start on them too; the rows wait in the outbox.
                log.warning(
                    "direct publish disabled; the relay publishes every message",
                    extra={"fields": {"error": describe(exc)}},
                )
                return
            except Exception as exc:  # the database or broker away: retried
                log.debug("direct publisher not ready: %s", describe(exc))
            await asyncio.sleep(RETRY_SECONDS)

    async def _open(self) -> None:
        if self._deployment is None:
            self._deployment = await self._deployment_id()
        connection = await self._monitor.wait_connected()
        # before anything is published: never onto another deployment's queues (the
        # robust connection declares it again after a reconnect)
        await hold_prefix(connection, self._topology, self._deployment)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await declare_topology(channel, self._topology)
        self._exchange = await channel.get_exchange(
            self._topology.exchange_for(JOBS_EXCHANGE), ensure=True
        )
        self._channel = channel
        log.info("direct publish ready")

    async def _publish(self, rows: list[Pending]) -> None:
        exchange, deployment = self._exchange, self._deployment
        if exchange is None or deployment is None:
            return
        began = time.monotonic()
        async with self._in_flight:
            results = await asyncio.gather(
                *(
                    publish_row(
                        exchange,
                        row,
                        deployment_id=deployment,
                        confirm_seconds=self._confirm_seconds,
                    )
                    for row in rows
                ),
                return_exceptions=True,
            )
        confirmed = [r for r in results if isinstance(r, int)]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            # unmarked: the relay publishes them once their grace has passed
            metrics.OUTBOX_DIRECT_FALLBACKS.inc(len(failures))
            DIRECT_PUBLISH.lost(failures[0], "direct publish")
        else:
            DIRECT_PUBLISH.answered(began)
        if confirmed:
            await self._mark_confirmed(confirmed)

    async def _mark_confirmed(self, ids: list[int]) -> None:
        """Mark `ids` with whatever other requests' confirmed rows wait to be marked: one
        statement for all of them, while the previous one runs."""
        self._unmarked.extend(ids)
        async with self._marking:
            if not self._unmarked:
                return  # a mark that ran while this one waited took them
            marking, self._unmarked = self._unmarked, []
            began = time.monotonic()
            try:
                await self._mark(marking)
            except Exception as exc:
                # published but unmarked: the relay publishes them again after their grace,
                # and the worker's claim drops the duplicate
                metrics.OUTBOX_DIRECT_UNMARKED.inc(len(marking))
                if is_connection_loss(exc):
                    DATABASE.lost(exc, "marking direct publications")
                else:
                    log.warning(
                        "marking direct publications failed; the relay publishes them again",
                        extra={"fields": {"rows": len(marking), "error": describe(exc)}},
                    )
                return
            DATABASE.answered(began)
            metrics.OUTBOX_DIRECT_PUBLISHED.inc(len(marking))
