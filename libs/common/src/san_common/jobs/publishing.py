"""Publishing an outbox row: the one way a job's message is put on the broker, shared by
the relay (every row, once due) and the API's direct publisher (a row it registered, right
after its commit), so that the two cannot stamp messages differently.

A message carries the envelope as stored, persistent, with the row's `message_id`, the job
type as its `type`, the trace context (the envelope's, continued by the publish span) and
the deployment's id (`DEPLOYMENT_HEADER`, which a worker checks). It is published
`mandatory` on a channel with publisher confirms: the call returns once the broker has it,
and raises when the broker refused it, could not route it, or did not answer in time.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aio_pika
import asyncpg
from aio_pika.abc import AbstractExchange

from san_common import tracing
from san_common.deployment import DEPLOYMENT_HEADER


@dataclass(frozen=True)
class Pending:
    """An unpublished outbox row as it is published: the envelope's JSON text as stored
    (published as it is: decoding it to re-encode it cost the relay more CPU than the
    publish), and its trace context."""

    id: int
    message_id: uuid.UUID
    exchange: str
    routing_key: str
    body: bytes
    headers: dict[str, Any]
    created_at: datetime
    traceparent: str | None
    tracestate: str | None


@dataclass
class DirectRows:
    """A request's registrations that its process publishes itself once the request's
    transaction has committed (`register_job_on_connection(direct=…)` adds them); each was
    inserted due only `grace_seconds` later, so that the relay publishes it only if nobody
    marked it by then (docs/architecture.md, "Direct publish")."""

    grace_seconds: float
    rows: list[Pending] = field(default_factory=list)


async def publish_row(
    exchange: AbstractExchange,
    row: Pending,
    *,
    deployment_id: str,
    confirm_seconds: float,
    routing_key: str | None = None,
) -> int:
    """Publish `row` on `exchange` (a channel with publisher confirms) and wait for the
    broker's confirm; returns the row's id. `routing_key`: another than the row's (its job
    queue's bulk lane, broker/topology.py)."""
    envelope_trace = _trace_headers(row)
    # The publish span continues the registering request's trace (the envelope's
    # traceparent); the worker continues from this span (the message headers).
    with tracing.span(
        f"publish {row.routing_key}",
        kind="producer",
        parent=envelope_trace,
        attributes={"messaging.message.id": str(row.message_id)},
    ):
        message = aio_pika.Message(
            row.body,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=str(row.message_id),
            timestamp=row.created_at,
            type=row.routing_key,
            headers={
                **row.headers,
                **envelope_trace,
                **tracing.current_trace_context(),
                DEPLOYMENT_HEADER: deployment_id,
            },
        )
        await exchange.publish(
            message,
            routing_key=routing_key or row.routing_key,
            mandatory=True,  # unroutable comes back: the channel raises it
            timeout=confirm_seconds,
        )
    return row.id


# Only rows nobody marked yet: a direct publisher's mark that comes after the relay's
# (its grace ran out first) changes nothing.
_MARK_UNMARKED = """
UPDATE outbox_messages SET published_at = now()
WHERE id = ANY($1::bigint[]) AND published_at IS NULL
"""


async def mark_published(executor: asyncpg.Pool | asyncpg.Connection, ids: Sequence[int]) -> None:
    """Mark the rows of a direct publisher's confirmed messages published, in one statement
    whatever their number."""
    if ids:
        await executor.execute(_MARK_UNMARKED, list(ids))


def _trace_headers(row: Pending) -> dict[str, str]:
    found = {"traceparent": row.traceparent, "tracestate": row.tracestate}
    return {k: v for k, v in found.items() if v}
