"""The caller's own jobs, read for `GET /async-jobs`."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, text, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import AsyncJob


async def page(
    session: AsyncSession,
    user_id: uuid.UUID,
    *,
    statuses: Sequence[str],
    job_types: Sequence[str],
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[AsyncJob]:
    """The user's jobs, newest first. (created_at, job_id) is a total order, so `after` —
    the last row of the previous page — is a stable keyset cursor: a job registered while
    a client pages never shifts a page or appears twice."""
    query = select(AsyncJob).where(AsyncJob.user_id == user_id)
    if statuses:
        query = query.where(AsyncJob.status.in_(list(statuses)))
    if job_types:
        query = query.where(AsyncJob.job_type.in_(list(job_types)))
    if after is not None:
        query = query.where(tuple_(AsyncJob.created_at, AsyncJob.job_id) < after)
    order = (AsyncJob.created_at.desc(), AsyncJob.job_id.desc())
    return list(await session.scalars(query.order_by(*order).limit(limit)))


# A PENDING job whose message is due and still in the outbox waits for the relay to admit
# it into its queue (docs/architecture.md, "Fair share and priorities";
# san_common/jobs/admission.py): held back by the queue's window behind other users' or
# interactive work. A relay round publishes a row it is free to publish within
# milliseconds, so only a row held for longer than `grace` counts. The user's rows are
# found on the relay's fair-claim index.
_AWAITING_ADMISSION = text(
    """
    SELECT DISTINCT (o.body->>'job_id')::uuid AS job_id
    FROM outbox_messages AS o
    WHERE o.user_id = :user_id AND o.published_at IS NULL
      AND o.available_at <= now() - make_interval(secs => :grace)
      AND o.body->>'job_id' = ANY(CAST(:job_ids AS text[]))
    """
)

ADMISSION_GRACE_SECONDS = 1.0


async def awaiting_admission(
    session: AsyncSession, user_id: uuid.UUID, job_ids: Sequence[uuid.UUID]
) -> set[uuid.UUID]:
    """Those of the user's `job_ids` whose message waits in the outbox for admission."""
    if not job_ids:
        return set()
    rows = await session.execute(
        _AWAITING_ADMISSION,
        {
            "user_id": user_id,
            "grace": ADMISSION_GRACE_SECONDS,
            "job_ids": [str(j) for j in job_ids],
        },
    )
    return {job_id for (job_id,) in rows}
