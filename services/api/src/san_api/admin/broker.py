"""RabbitMQ for operators: queue depths and the dead-letter queue.

Depths come from the management API when `RABBITMQ_MANAGEMENT_URL` is set (messages,
consumers, unacked), else from passive declares (messages ready, consumers). Each call
opens its own short connection: operators are few, and the API otherwise never needs the
broker (the outbox absorbs its outages).

The dead-letter queue is read without loss: a message taken off it is first published
again (to the dead-letter queue's tail to keep it, or to the jobs exchange to re-drive it)
with publisher confirms, and only then acked. Nothing is ever requeued with a nack, which
would count against a quorum queue's delivery limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import httpx
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from aiormq.exceptions import AMQPError

from san_api.errors import BrokerUnavailable
from san_common.broker.connect import connect
from san_common.broker.topology import Topology
from san_common.jobs import registry

_CONNECT_SECONDS = 5.0
_HEADERS_DROPPED_ON_REDRIVE = (
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-last-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-delivery-count",
)
_MANAGEMENT_COLUMNS = "name,messages_ready,messages_unacknowledged,consumers"


@dataclass(frozen=True)
class QueueDepth:
    name: str
    messages: int
    consumers: int
    unacked: int | None


@dataclass(frozen=True)
class DeadLetter:
    message_id: str | None
    job_id: str | None
    job_type: str | None
    reason: str | None
    queue: str | None
    deaths: int
    dead_lettered_at: datetime | None
    routing_key: str | None
    body: str


Selector = Callable[[DeadLetter], bool]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def describe(message: AbstractIncomingMessage) -> DeadLetter:
    headers: dict[str, Any] = dict(message.headers or {})
    deaths: list[Any] = headers.get("x-death") or []
    first: dict[str, Any] = deaths[0] if isinstance(deaths, list) and deaths else {}
    routing_keys = first.get("routing-keys") or []
    body_text = message.body.decode(errors="replace")
    job_id = job_type = None
    envelope_message_id = None
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        envelope = json.loads(body_text)
        job_id = _text(envelope.get("job_id"))
        job_type = _text(envelope.get("job_type"))
        envelope_message_id = _text(envelope.get("message_id"))
    at = first.get("time")
    return DeadLetter(
        message_id=_text(message.message_id) or envelope_message_id,
        job_id=job_id,
        job_type=job_type,
        reason=_text(headers.get("x-first-death-reason") or first.get("reason")),
        queue=_text(headers.get("x-first-death-queue") or first.get("queue")),
        deaths=sum(int(d.get("count", 1)) for d in deaths if isinstance(d, dict)),
        dead_lettered_at=at.replace(tzinfo=UTC) if isinstance(at, datetime) else None,
        routing_key=_text(routing_keys[0]) if routing_keys else (job_type or message.routing_key),
        body=body_text[:2000],
    )


class BrokerAdmin:
    def __init__(self, amqp_url: str, topology: Topology, management_url: str = "") -> None:
        self._url = amqp_url
        self._topology = topology
        self._management = management_url.rstrip("/")

    @property
    def topology(self) -> Topology:
        return self._topology

    @contextlib.asynccontextmanager
    async def _channel(self) -> AsyncIterator[AbstractChannel]:
        try:
            connection = await asyncio.wait_for(connect(self._url), _CONNECT_SECONDS)
        except (OSError, AMQPError, TimeoutError) as exc:
            raise BrokerUnavailable(f"cannot reach RabbitMQ: {type(exc).__name__}") from exc
        try:
            yield await connection.channel(publisher_confirms=True)
        except AMQPError as exc:
            raise BrokerUnavailable(f"RabbitMQ refused the operation: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                await connection.close()

    async def depths(self) -> tuple[str, list[QueueDepth]]:
        names = self._topology.all_queue_names()
        if self._management:
            return "management", await self._management_depths(names)
        depths = []
        async with self._channel() as channel:
            for name in names:
                queue = await channel.declare_queue(name, passive=True)
                result = queue.declaration_result
                depths.append(
                    QueueDepth(name, result.message_count or 0, result.consumer_count or 0, None)
                )
        return "passive", depths

    async def _management_depths(self, names: list[str]) -> list[QueueDepth]:
        parts = urlsplit(self._management)
        auth = (parts.username or "guest", parts.password or "guest")
        base = urlunsplit((parts.scheme, parts.hostname or "", "", "", ""))
        if parts.port:
            base = f"{base}:{parts.port}"
        try:
            async with httpx.AsyncClient(base_url=base, auth=auth, timeout=5) as client:
                response = await client.get(
                    "/api/queues/%2F", params={"columns": _MANAGEMENT_COLUMNS}
                )
                response.raise_for_status()
                found = {q["name"]: q for q in response.json()}
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise BrokerUnavailable(f"the RabbitMQ management API failed: {exc}") from exc
        return [
            QueueDepth(
                name,
                int(found.get(name, {}).get("messages_ready", 0) or 0),
                int(found.get(name, {}).get("consumers", 0) or 0),
                int(found.get(name, {}).get("messages_unacknowledged", 0) or 0),
            )
            for name in names
        ]

    async def dead_letter_count(self) -> int:
        async with self._channel() as channel:
            queue = await channel.declare_queue(self._topology.dead_letter_queue, passive=True)
            return queue.declaration_result.message_count or 0

    async def peek(self, limit: int) -> tuple[int, list[DeadLetter]]:
        """The first `limit` dead letters, each moved to the queue's tail (so repeated
        peeks page through a long queue)."""
        total, seen, _ = await self._walk(limit, lambda _: False, keep=True)
        return total, seen

    async def redrive(self, select: Selector, limit: int) -> int:
        """Publish matching dead letters to the jobs exchange again (original routing key,
        without the dead-letter headers); keep the others."""
        _, _, moved = await self._walk(limit, select, keep=False, redrive=True)
        return moved

    async def purge(self, select: Selector, limit: int) -> int:
        _, _, moved = await self._walk(limit, select, keep=False, redrive=False)
        return moved

    async def purge_all(self) -> int:
        async with self._channel() as channel:
            queue = await channel.declare_queue(self._topology.dead_letter_queue, passive=True)
            result = await queue.purge()
            return int(getattr(result, "message_count", 0) or 0)

    async def _walk(
        self, limit: int, select: Selector, *, keep: bool, redrive: bool = False
    ) -> tuple[int, list[DeadLetter], int]:
        """Take up to `limit` messages (never more than were there at the start); matching
        ones are re-driven (or dropped), the rest go to the tail."""
        async with self._channel() as channel:
            dead = await channel.declare_queue(self._topology.dead_letter_queue, passive=True)
            total = dead.declaration_result.message_count or 0
            jobs = await channel.get_exchange(self._topology.jobs_exchange)
            seen: list[DeadLetter] = []
            moved = 0
            for _ in range(min(total, limit)):
                message = await dead.get(no_ack=False, fail=False)
                if message is None:
                    break
                letter = describe(message)
                seen.append(letter)
                if not keep and select(letter):
                    if redrive:
                        headers = {
                            k: v
                            for k, v in (message.headers or {}).items()
                            if k not in _HEADERS_DROPPED_ON_REDRIVE
                        }
                        await jobs.publish(
                            _copy(message, headers),
                            routing_key=letter.routing_key or message.routing_key or "",
                        )
                    moved += 1
                else:
                    await channel.default_exchange.publish(
                        _copy(message, dict(message.headers or {})),
                        routing_key=self._topology.dead_letter_queue,
                    )
                await message.ack()
            return total, seen, moved


def _copy(message: AbstractIncomingMessage, headers: dict[str, Any]) -> aio_pika.Message:
    return aio_pika.Message(
        body=message.body,
        headers=headers,
        content_type=message.content_type,
        message_id=message.message_id,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        timestamp=message.timestamp,
        type=message.type,
    )


def queue_job_type(topology: Topology, name: str) -> str | None:
    for job_type in registry.job_types():
        if topology.queue_name(job_type) == name:
            return job_type
    return None
