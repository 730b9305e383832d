"""Outbox queries of the relay."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from san_common.jobs.publishing import Pending
from san_common.models import OutboxMessage

__all__ = [
    "Batch",
    "Pending",
    "SoleUser",
    "backlog",
    "claim_unpublished",
    "ensure_lanes",
    "mark_published",
    "sole_user",
    "take_lane",
]


@dataclass(frozen=True)
class Batch:
    """A round's locked rows, and in how many seconds the earliest row that is not due
    yet becomes due (None: there is none) — when the relay must wake up by itself."""

    rows: list[Pending]
    next_due_seconds: float | None
    # the queue numbers the fair claim left due rows behind for (their windows were full)
    held: frozenset[int] = frozenset()
    # the rows go to their job queue's bulk lane (one user's, nobody else's due)
    bulk: bool = False


# One statement a round: the batch, and when to wake up next (a separate query for the
# next due time, run before every sleep, was a tenth of the relay's CPU under a trickle of
# jobs: docs/hot-paths.md). A function of migration 0008, which carries the planner
# setting that keeps the claim on its index whatever the statistics say.
_CLAIM = "SELECT * FROM claim_outbox($1)"


async def claim_unpublished(connection: AsyncConnection, limit: int) -> Batch:
    """Lock a batch of unpublished rows that are due (`available_at` has come). SKIP LOCKED
    lets replicas take disjoint batches; the locks last until the caller's transaction
    ends."""
    return _batch((await connection.exec_driver_sql(_CLAIM, (limit,))).mappings().all())


# Migration 0018's function: the due rows in admission order, at most rooms[q] for queue q.
_CLAIM_FAIR = "SELECT * FROM claim_outbox_fair($1, $2, $3, $4, $5)"


async def claim_fair(
    connection: AsyncConnection,
    limit: int,
    *,
    keys: list[str],
    key_queue: list[int],
    rooms: list[int],
    aging_seconds: float,
) -> Batch:
    """Lock at most `limit` due rows, at most `rooms[q - 1]` of them for the routing keys
    whose queue number (`key_queue`) is q: interactive first (a batch row due for longer
    than `aging_seconds` counts as interactive), then round-robin by user weighted by
    `users.share_weight`, then oldest first (docs/architecture.md, "Fair share and
    priorities"). SKIP LOCKED as `claim_unpublished`."""
    params = (limit, keys, key_queue, rooms, aging_seconds)
    return _batch((await connection.exec_driver_sql(_CLAIM_FAIR, params)).mappings().all())


def _batch(rows: Sequence[Any]) -> Batch:
    seconds = rows[0]["next_due_seconds"]
    return Batch(
        [
            Pending(
                id=row["id"],
                message_id=row["message_id"],
                exchange=row["exchange"],
                routing_key=row["routing_key"],
                body=row["body"].encode(),
                headers=json.loads(row["headers"]) if row["headers"] != "{}" else {},
                created_at=row["created_at"],
                traceparent=row["traceparent"],
                tracestate=row["tracestate"],
            )
            for row in rows
            if row["id"] is not None
        ],
        None if seconds is None else max(0.0, seconds),
        frozenset(rows[0].get("held") or ()),
    )


# The batch's one user when it is the only one with work due for `keys` (a queue's routing
# keys), at one priority class — then nobody's work can wait behind the batch in the
# queue's bulk lane — with the lane's row locked and its owner (whose messages the lane
# may hold). The batch's rows are locked by this transaction, the others are read as
# committed. Three probes of the fair index (user, class, routing key, id) over the
# unpublished rows, each stopping at its first row: the other users below and above the
# batch's, and the user's rows of the other class.
_SOLE_USER = """
WITH b AS (
    SELECT count(DISTINCT user_id) AS users, count(DISTINCT priority) AS classes,
           (array_agg(user_id))[1] AS u, (array_agg(priority))[1] AS p
    FROM outbox_messages WHERE id = ANY($1::bigint[])
)
SELECT b.u,
       (SELECT l.user_id FROM outbox_bulk_lanes l WHERE l.queue = $3 FOR UPDATE) AS owner
FROM b
WHERE b.users = 1 AND b.classes = 1
  AND NOT EXISTS (SELECT 1 FROM outbox_messages o WHERE o.published_at IS NULL
                  AND o.user_id < b.u AND o.routing_key = ANY($2) AND o.available_at <= now())
  AND NOT EXISTS (SELECT 1 FROM outbox_messages o WHERE o.published_at IS NULL
                  AND o.user_id > b.u AND o.routing_key = ANY($2) AND o.available_at <= now())
  AND NOT EXISTS (SELECT 1 FROM outbox_messages o WHERE o.published_at IS NULL
                  AND o.user_id = b.u AND o.priority <> b.p AND o.routing_key = ANY($2)
                  AND o.available_at <= now())
"""


@dataclass(frozen=True)
class SoleUser:
    user_id: uuid.UUID
    lane_owner: uuid.UUID | None  # the user whose messages the bulk lane may hold


async def sole_user(
    connection: AsyncConnection, ids: Sequence[int], *, keys: Sequence[str], queue: str
) -> SoleUser | None:
    """The user of every row `ids` when nobody else has work due for the routing keys
    `keys` (and the user none of the other priority class), with `queue`'s bulk lane
    locked until the transaction ends; else None."""
    found = await connection.exec_driver_sql(_SOLE_USER, (list(ids), list(keys), queue))
    row = found.mappings().first()
    return None if row is None else SoleUser(row["u"], row["owner"])


_ENSURE_LANES = (
    "INSERT INTO outbox_bulk_lanes (queue) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING"
)


async def ensure_lanes(connection: AsyncConnection, queues: Sequence[str]) -> None:
    """A row per bulk lane, so that the relays' rounds lock one (`sole_user`)."""
    await connection.exec_driver_sql(_ENSURE_LANES, (list(queues),))


_TAKE_LANE = "UPDATE outbox_bulk_lanes SET user_id = $2, taken_at = now() WHERE queue = $1"


async def take_lane(connection: AsyncConnection, queue: str, user_id: uuid.UUID) -> None:
    await connection.exec_driver_sql(_TAKE_LANE, (queue, user_id))


_MARK = "UPDATE outbox_messages SET published_at = now() WHERE id = ANY($1::bigint[])"


async def mark_published(connection: AsyncConnection, ids: Sequence[int]) -> None:
    # one prepared statement whatever the batch size (an ORM IN-list update was compiled
    # afresh for every round and size)
    if ids:
        await connection.exec_driver_sql(_MARK, (list(ids),))


async def backlog(session: AsyncSession) -> tuple[int, float]:
    """(unpublished rows that are due, age in seconds of the oldest one since it was due);
    rows scheduled for later (retries) are not backlog."""
    row = (
        await session.execute(
            select(
                func.count(),
                func.coalesce(
                    func.extract("epoch", func.now() - func.min(OutboxMessage.available_at)), 0
                ),
            ).where(OutboxMessage.published_at.is_(None), OutboxMessage.available_at <= func.now())
        )
    ).one()
    return int(row[0]), float(row[1])
