"""RabbitMQ for operators: queue depths and the dead-letter queue.

Depths come from the management API when `RABBITMQ_MANAGEMENT_URL` is set (messages,
consumers, unacked), else from passive declares (messages ready, consumers). Each call
opens its own short connection: operators are few, and the API otherwise never needs the
broker (the outbox absorbs its outages).

The dead-letter queue (a classic queue, broker/topology.py) is read without changing it:
its messages are taken unacknowledged, in order, on one channel, and given back
(`basic.nack`, requeue), which puts each at its old place unchanged. A re-driven message
is acked only once the broker confirmed it on its job type's queue (published mandatory:
no queue, no confirm); a purged one is acked. Another operator's read at the same moment
sees fewer (those held here), never a changed queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import httpx
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage
from aio_pika.exceptions import ChannelInvalidStateError, DeliveryError
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity
from pydantic import ValidationError

from san_api.errors import BrokerUnavailable
from san_common.broker.connect import connect
from san_common.broker.topology import (
    DEAD_LETTERED_AT_HEADER,
    DETAIL_HEADER,
    REASON_HEADER,
    SOURCE_QUEUE_HEADER,
    Topology,
)
from san_common.cli import describe as describe_error
from san_common.deployment import DEPLOYMENT_HEADER
from san_common.jobs import registry
from san_common.jobs.envelope import ENVELOPE_VERSION, JobMessage

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
    REASON_HEADER,
    DETAIL_HEADER,
    DEAD_LETTERED_AT_HEADER,
    SOURCE_QUEUE_HEADER,
)
_PUBLISH_SECONDS = 10.0
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
    detail: str | None
    by: str | None  # "worker" (x-san-reason) or "broker" (x-death)
    queue: str | None
    deaths: int
    dead_lettered_at: datetime | None
    deployment: str | None
    body: str


@dataclass(frozen=True)
class Settled:
    """What an action did to one dead letter."""

    letter: DeadLetter
    result: str  # redriven | not-redrivable | failed | purged
    reason: str | None = None


Selector = Callable[[DeadLetter], bool]
# The job ids (of those given) this deployment's database knows.
KnownJobs = Callable[[list[str]], Awaitable[set[str]]]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def describe(message: AbstractIncomingMessage, topology: Topology) -> DeadLetter:
    """Whoever dead-lettered it: a worker says why in its `x-san-*` headers, the broker in
    `x-death` (rejected, expired, delivery limit)."""
    headers: dict[str, Any] = dict(message.headers or {})
    deaths: list[Any] = headers.get("x-death") or []
    first: dict[str, Any] = deaths[0] if isinstance(deaths, list) and deaths else {}
    body_text = message.body.decode(errors="replace")
    envelope: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        parsed = json.loads(body_text)
        envelope = parsed if isinstance(parsed, dict) else {}
    by: str | None = None
    reason = queue = None
    at: datetime | None = None
    if REASON_HEADER in headers:
        by, reason = "worker", _text(headers[REASON_HEADER])
        queue = _text(headers.get(SOURCE_QUEUE_HEADER))
        at = _utc(headers.get(DEAD_LETTERED_AT_HEADER))
    elif first:
        by, reason = "broker", _text(headers.get("x-first-death-reason") or first.get("reason"))
        queue = _text(headers.get("x-first-death-queue") or first.get("queue"))
        at = _utc(first.get("time"))
    job_type = _text(envelope.get("job_type"))
    if job_type is None and queue is not None:
        job_type = queue_job_type(topology, queue)  # the queue it came from names its type
    message_id = _text(message.message_id) or _text(envelope.get("message_id"))
    if message_id is None:  # still selectable on its own, by what it holds
        message_id = "sha256:" + hashlib.sha256(message.body).hexdigest()[:16]
    return DeadLetter(
        message_id=message_id,
        job_id=_text(envelope.get("job_id")),
        job_type=job_type,
        reason=reason,
        detail=_text(headers.get(DETAIL_HEADER)),
        by=by,
        queue=queue,
        deaths=sum(int(d.get("count", 1)) for d in deaths if isinstance(d, dict)),
        dead_lettered_at=at,
        deployment=_text(headers.get(DEPLOYMENT_HEADER)),
        body=body_text[:2000],
    )


def not_redrivable(
    message: AbstractIncomingMessage, deployment_id: str, known_jobs: set[str]
) -> str | None:
    """Why re-driving this message could only dead-letter it again; None if it can run.
    The same checks, in the same order, as a worker's (worker/executor.py)."""
    sender = _text((message.headers or {}).get(DEPLOYMENT_HEADER))
    if sender is not None and sender != deployment_id:
        return f"a message of deployment {sender}; this is deployment {deployment_id}"
    try:
        envelope = JobMessage.model_validate_json(message.body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return f"not a job message ({problems[:300]})"
    if envelope.version != ENVELOPE_VERSION:
        return f"envelope version {envelope.version}; this deployment reads {ENVELOPE_VERSION}"
    if registry.find(envelope.job_type) is None:
        return f"no such job type: {envelope.job_type}"
    if str(envelope.job_id) not in known_jobs:
        return f"job {envelope.job_id} is not in this deployment's database"
    return None


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
        async with self._connection() as connection:
            # returns raised: a re-drive that reaches no queue is a failure, not a success
            yield await connection.channel(publisher_confirms=True, on_return_raises=True)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[AbstractConnection]:
        try:
            connection = await asyncio.wait_for(connect(self._url), _CONNECT_SECONDS)
        except (OSError, AMQPError, TimeoutError) as exc:
            raise BrokerUnavailable(f"cannot reach RabbitMQ: {type(exc).__name__}") from exc
        try:
            yield connection
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
        async with self._connection() as connection:
            channel = await connection.channel()
            for name in names:
                if channel.is_closed:  # the missing queue before closed it
                    channel = await connection.channel()
                try:
                    queue = await channel.declare_queue(name, passive=True)
                except ChannelNotFoundEntity:
                    # not declared (yet): a bulk lane of a version no relay or worker of this
                    # deployment has started with, say. Left out, not a failed page.
                    continue
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

    async def peek(self, limit: int) -> tuple[int, list[DeadLetter]]:
        """The total, and the first `limit` dead letters in queue order, left as they were."""
        async with self._held(limit) as (total, _, held):
            return total, [describe(m, self._topology) for m in held]

    async def redrive(
        self, select: Selector, limit: int, *, deployment_id: str, known_jobs: KnownJobs
    ) -> list[Settled]:
        """Publish each matching dead letter that can run (`not_redrivable`) to its job
        type's queue, with confirms, and ack it once confirmed; the others stay."""
        async with self._held(limit) as (_, channel, held):
            chosen = [(m, letter) for m in held if select(letter := describe(m, self._topology))]
            known = await known_jobs([letter.job_id for _, letter in chosen if letter.job_id])
            jobs = await channel.get_exchange(self._topology.jobs_exchange)
            settled: list[Settled] = []
            for message, letter in chosen:
                why = not_redrivable(message, deployment_id, known)
                if why is not None:
                    settled.append(Settled(letter, "not-redrivable", why))
                    continue
                headers = {
                    **{
                        k: v
                        for k, v in (message.headers or {}).items()
                        if k not in _HEADERS_DROPPED_ON_REDRIVE
                    },
                    DEPLOYMENT_HEADER: deployment_id,
                }
                try:
                    await jobs.publish(
                        _copy(message, headers),
                        routing_key=str(letter.job_type),
                        mandatory=True,
                        timeout=_PUBLISH_SECONDS,
                    )
                except (DeliveryError, AMQPError, ChannelInvalidStateError, TimeoutError) as exc:
                    settled.append(Settled(letter, "failed", describe_error(exc)))
                    continue
                await message.ack()
                settled.append(Settled(letter, "redriven"))
            return settled

    async def purge(self, select: Selector, limit: int) -> list[Settled]:
        async with self._held(limit) as (_, _, held):
            settled = []
            for message in held:
                letter = describe(message, self._topology)
                if select(letter):
                    await message.ack()
                    settled.append(Settled(letter, "purged"))
            return settled

    async def purge_all(self) -> int:
        async with self._channel() as channel:
            queue = await channel.declare_queue(self._topology.dead_letter_queue, passive=True)
            result = await queue.purge()
            return int(getattr(result, "message_count", 0) or 0)

    @contextlib.asynccontextmanager
    async def _held(
        self, limit: int
    ) -> AsyncIterator[tuple[int, AbstractChannel, list[AbstractIncomingMessage]]]:
        """The queue's total, and its first `limit` messages (never more than were there at
        the start) held unacknowledged on one channel; those still unsettled at the end are
        given back, each to its old place."""
        async with self._channel() as channel:
            dead = await channel.declare_queue(self._topology.dead_letter_queue, passive=True)
            total = dead.declaration_result.message_count or 0
            held: list[AbstractIncomingMessage] = []
            try:
                for _ in range(min(total, limit)):
                    message = await dead.get(no_ack=False, fail=False)
                    if message is None:
                        break
                    held.append(message)
                yield total, channel, held
            finally:
                for message in held:
                    if not message.processed:
                        # if the channel is gone, the broker gives them back the same way
                        with contextlib.suppress(AMQPError, ChannelInvalidStateError):
                            await message.nack(requeue=True)


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
    """The job type of job queue `name`, or of its bulk lane; None for another queue."""
    for job_type in registry.job_types():
        if name in (topology.queue_name(job_type), topology.bulk_queue_name(job_type)):
            return job_type
    return None
