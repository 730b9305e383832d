"""The caller's own jobs, read for `GET /async-jobs`."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, tuple_
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
