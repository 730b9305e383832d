"""The AMQP side of a worker: one connection, one channel, one consumer per queue the
process serves and one per queue's bulk lane, and one limit on the jobs running at once in
the process.

Quorum queues do not support a channel-global prefetch (`basic.qos(global=True)`), so
`WORKER_PREFETCH` is enforced in two layers: each consumer's prefetch is the limit (a
single busy queue may use all of it), and a process-wide semaphore of the same size lets at
most that many deliveries execute at once. Deliveries beyond it wait in memory, unacked
(at most `(consumers - 1) × prefetch` of them), and take their turn in the order they
arrived, whichever consumer took them: the broker gives them to another worker if
this one dies, one still waiting when the worker drains goes back to its queue unstarted,
and a prefetch-1 worker runs exactly one job at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from san_common.broker.connect import connect_robust
from san_common.broker.monitor import connection_is_open
from san_common.broker.ownership import hold_prefix
from san_common.broker.topology import (
    DEAD_LETTERED_AT_HEADER,
    DETAIL_HEADER,
    REASON_HEADER,
    SOURCE_QUEUE_HEADER,
    Topology,
    declare_topology,
)
from san_common.errors import is_connection_loss
from san_common.outages import DATABASE
from san_common.worker.pauses import PausedTypes

log = logging.getLogger("san_common.worker")


class AmqpDelivery:
    """An aio-pika message as the executor's `Delivery`."""

    def __init__(
        self,
        message: AbstractIncomingMessage,
        dead_letters: AbstractExchange,
        job_type: str,
        queue: str,
    ) -> None:
        self._message = message
        self._dead_letters = dead_letters
        self._job_type = job_type
        self._queue = queue

    @property
    def body(self) -> bytes:
        return self._message.body

    @property
    def headers(self) -> Mapping[str, Any]:
        return self._message.headers or {}

    @property
    def delivery_count(self) -> int:
        count = self.headers.get("x-delivery-count", 0)
        return count if isinstance(count, int) else 0

    async def ack(self) -> None:
        # its own delivery only: `multiple` would also settle the deliveries still
        # running below its tag (lost if the worker dies)
        await self._message.ack()

    async def requeue(self) -> None:
        await self._message.nack(requeue=True)

    async def dead_letter(self, kind: str, reason: str) -> None:
        """Republish to the DLX with the reason, time and source queue (confirmed), then
        ack; if that fails, reject, and the queue's own dead-lettering takes it (with
        `x-death`, without our reason)."""
        original = self._message
        headers = {
            **(original.headers or {}),
            REASON_HEADER: kind,
            DETAIL_HEADER: reason[:500],
            DEAD_LETTERED_AT_HEADER: datetime.now(UTC),
            SOURCE_QUEUE_HEADER: self._queue,
        }
        try:
            await self._dead_letters.publish(
                aio_pika.Message(
                    body=original.body,
                    headers=headers,
                    content_type=original.content_type,
                    message_id=original.message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=self._job_type,
                timeout=10,
            )
        except Exception:
            log.warning("could not republish the dead letter; rejecting it", exc_info=True)
            await original.reject(requeue=False)
            return
        await original.ack()


Handle = Callable[[AmqpDelivery], Awaitable[object]]


class Consumer:
    def __init__(
        self,
        *,
        amqp_url: str,
        topology: Topology,
        job_types: Sequence[str],
        prefetch: int,
        drain_seconds: float,
        handle: Handle,
        heartbeat_seconds: int | None = None,
        paused: PausedTypes | None = None,
        pause_poll_seconds: float = 1.0,
    ) -> None:
        self._paused = paused
        self._pause_poll_seconds = pause_poll_seconds
        self._amqp_url = _with_heartbeat(amqp_url, heartbeat_seconds)
        self._topology = topology
        self._job_types = list(job_types)
        self._prefetch = prefetch
        self._drain_seconds = drain_seconds
        self._handle = handle
        self._slots = asyncio.Semaphore(prefetch)
        self._inflight: set[asyncio.Task[None]] = set()
        self._draining = False
        self.connected = asyncio.Event()
        # Readiness (what `consuming()` reads; no probe touches the broker).
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._consuming = False

    def consuming(self) -> bool:
        """Ready (docs/reference/job-rules.md §7): the consumer connection and channel are open and
        its consumers registered; false while aio_pika reconnects and once draining starts."""
        return (
            self._consuming
            and connection_is_open(self._connection)
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def run(self, stop: asyncio.Event, *, worker_id: str, deployment_id: str) -> None:
        """Hold the prefix for `deployment_id` (`PrefixInUse` if another deployment does),
        consume until `stop` is set, then drain: take nothing new, let in-flight jobs
        finish for up to `drain_seconds`, then cancel the rest (the executor releases their
        jobs and requeues their messages)."""
        connection = await connect_robust(self._amqp_url)
        try:
            await hold_prefix(connection, self._topology, deployment_id)
            # Confirms: a dead letter republished with its reason is acked only once the
            # broker has it.
            channel = await connection.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=self._prefetch)
            consumers = await self._consume(channel)
            log.info(
                "worker consuming",
                extra={
                    "fields": {
                        "worker_id": worker_id,
                        "queues": [q.name for q, _ in consumers],
                        "prefetch": self._prefetch,
                    }
                },
            )
            self._connection, self._channel, self._consuming = connection, channel, True
            self.connected.set()
            await self._follow_pauses(stop, consumers)
            self._consuming, self._draining = False, True
            log.info("worker draining", extra={"fields": {"in_flight": len(self._inflight)}})
            for queue, tag in consumers:
                if tag:
                    await queue.cancel(tag)
            await self._drain()
        finally:
            await connection.close()
            log.info("worker stopped")

    async def _consume(self, channel: AbstractChannel) -> list[tuple[AbstractQueue, str]]:
        """A consumer for each job type's queue and one for its bulk lane (topology.py),
        each with its own prefetch: a user's backlog in the lane never holds every slot a
        consumer of the queue could give another user's job."""
        queues = await declare_topology(channel, self._topology)
        dead_letters = await channel.get_exchange(self._topology.dead_letter_exchange)
        consumers: list[tuple[AbstractQueue, str]] = []
        self._callbacks: list[Callable[[AbstractIncomingMessage], Awaitable[None]]] = []
        self._consumed_types: list[str] = []
        for job_type in self._job_types:
            on_message = self._receiver(dead_letters, job_type)
            bulk = await channel.get_queue(self._topology.bulk_queue_name(job_type), ensure=False)
            for queue in (queues[job_type], bulk):
                self._callbacks.append(on_message)
                self._consumed_types.append(job_type)
                consumers.append((queue, await queue.consume(on_message)))
        return consumers

    async def _follow_pauses(
        self, stop: asyncio.Event, consumers: list[tuple[AbstractQueue, str]]
    ) -> None:
        """Until `stop`: every `pause_poll_seconds`, cancel the consumer of each job type an
        operator paused and consume again once resumed. A paused queue keeps its messages;
        deliveries already received are still run (and settled) as usual.

        The same read is the worker's breaker: while it finds the database unreachable (a
        reset, a refusal, or no answer within the engine's timeout), no queue is consumed.
        Each delivery taken meanwhile could only be requeued after a pause, again and
        again for a long outage, and every requeue counts against the queue's delivery
        limit; a worker cut off alone would keep taking its share of messages that the
        others could run. The messages wait in the queue instead, and consuming resumes
        at the first read that succeeds."""
        if self._paused is None:
            await stop.wait()
            return
        callbacks = {queue.name: self._callbacks[i] for i, (queue, _) in enumerate(consumers)}
        served = frozenset(self._job_types)
        paused: frozenset[str] = frozenset()
        unreachable = unreadable = False
        while True:
            began = time.monotonic()
            try:
                now_paused = await self._paused() & served
            except Exception as exc:
                if is_connection_loss(exc):
                    DATABASE.lost(exc, "reading the paused job types")
                    if not unreachable:  # the outage's WARNING is DATABASE's, once
                        log.info("database unreachable; consuming stopped until it answers")
                    unreachable = True
                elif not unreadable:  # not an outage: keep consuming as we were
                    log.info(
                        "paused job types unreadable; consuming as before",
                        extra={"fields": {"error": type(exc).__name__}},
                    )
                    unreadable = True
            else:
                DATABASE.answered(began)
                if unreachable:
                    log.info("database answers again; consuming")
                for job_type in sorted(now_paused - paused):
                    log.info("job type paused", extra={"fields": {"job_type": job_type}})
                for job_type in sorted(paused - now_paused):
                    log.info("job type resumed", extra={"fields": {"job_type": job_type}})
                paused, unreachable, unreadable = now_paused, False, False
            idle = served if unreachable else paused
            for i, (queue, tag) in enumerate(consumers):
                if self._consumed_types[i] in idle and tag:
                    await queue.cancel(tag)
                    consumers[i] = (queue, "")
                elif self._consumed_types[i] not in idle and not tag:
                    consumers[i] = (queue, await queue.consume(callbacks[queue.name]))
            try:
                await asyncio.wait_for(stop.wait(), timeout=self._pause_poll_seconds)
                return
            except TimeoutError:
                continue

    def _receiver(
        self, dead_letters: AbstractExchange, job_type: str
    ) -> Callable[[AbstractIncomingMessage], Awaitable[None]]:
        queue = self._topology.queue_name(job_type)

        async def on_message(message: AbstractIncomingMessage) -> None:
            self._start(AmqpDelivery(message, dead_letters, job_type, queue))

        return on_message

    def _start(self, delivery: AmqpDelivery) -> None:
        task = asyncio.create_task(self._run_one(delivery))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _run_one(self, delivery: AmqpDelivery) -> None:
        async with self._slots:
            if self._draining:
                # It waited for a slot (a worker of several queues holds up to a prefetch
                # from each) and the drain began meanwhile: not started, so it goes straight
                # back to the queue for another worker rather than begin in the drain window.
                await _requeue(delivery)
                return
            try:
                await self._handle(delivery)
            except asyncio.CancelledError:
                raise
            except Exception:  # the executor settles every delivery; this is the last net
                log.exception("delivery handler crashed; the message is requeued")
                await _requeue(delivery)

    async def _drain(self) -> None:
        if not self._inflight:
            return
        _, pending = await asyncio.wait(self._inflight, timeout=self._drain_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _requeue(delivery: AmqpDelivery) -> None:
    try:
        await delivery.requeue()
    except Exception:
        log.info("requeue failed; the broker redelivers the message")


def _with_heartbeat(amqp_url: str, seconds: int | None) -> str:
    """`amqp_url` asking for a `seconds` heartbeat, unless the URL names one itself."""
    from yarl import URL

    url = URL(amqp_url)
    if seconds is None or "heartbeat" in url.query:
        return amqp_url
    return str(url.update_query(heartbeat=seconds))
