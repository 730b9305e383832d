"""Admission into the job queues: priority classes, and whether a job is held back.

Every outbox row carries its user and its priority class (migration 0018). The relay
publishes into a queue only up to an in-flight window; when more is due than the window
holds, it admits the due rows interactive first, then round-robin by user weighted by
`users.share_weight` (docs/architecture.md, "Fair share and priorities"). A PENDING job
whose message is due and still unpublished is waiting for admission: held back by the
window behind other users' work or behind interactive work — or, for at most a relay
round, about to be published.
"""

from __future__ import annotations

import uuid
from enum import IntEnum

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

# The user of a message that belongs to nobody (a row registered before migration 0018).
NO_USER = uuid.UUID(int=0)


class Priority(IntEnum):
    """A job's priority class: a lower value is admitted first. A batch row due for longer
    than `RELAY_BATCH_AGING_SECONDS` counts as interactive, so batch work is never starved."""

    INTERACTIVE = 0  # someone is waiting on it: POST /scraps, POST /til, quizzes, commits
    BATCH = 1  # the daily TIL batch, recovery's re-registrations and re-publications


# A job's message that is due and not yet published (the user_id condition keeps the
# lookup on the fair-claim index, ix_outbox_messages_fair).
_AWAITING = text(
    """
    SELECT o.priority, o.available_at
    FROM outbox_messages o
    WHERE o.user_id = :user_id AND o.published_at IS NULL AND o.available_at <= now()
      AND o.body->>'job_id' = :job_id
    ORDER BY o.id
    LIMIT 1
    """
)

# Per job queue's routing key: how many messages are due and unpublished, by class.
_AWAITING_BY_KEY = text(
    """
    SELECT o.routing_key, o.priority, count(*) AS n
    FROM outbox_messages o
    WHERE o.published_at IS NULL AND o.available_at <= now()
    GROUP BY o.routing_key, o.priority
    """
)


async def awaiting_admission(
    session: AsyncSession, job_id: uuid.UUID, user_id: uuid.UUID
) -> Priority | None:
    """The class of `job_id`'s message when it is due and unpublished (the job waits for
    the relay to admit it into its queue), else None (published, scheduled for later, or
    no message)."""
    row = (await session.execute(_AWAITING, {"user_id": user_id, "job_id": str(job_id)})).first()
    return None if row is None else Priority(row.priority)


async def awaiting_by_routing_key(session: AsyncSession) -> dict[tuple[str, Priority], int]:
    """Due, unpublished messages per (routing key = job type, class): the backlog the
    windows hold back (plus at most a relay round's worth about to be published)."""
    rows = (await session.execute(_AWAITING_BY_KEY)).all()
    return {(r.routing_key, Priority(r.priority)): int(r.n) for r in rows}
