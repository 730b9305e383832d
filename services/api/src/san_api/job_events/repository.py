from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import AsyncJobEvent


async def events_after(
    session: AsyncSession, job_id: uuid.UUID, after: int, *, limit: int = 100
) -> Sequence[AsyncJobEvent]:
    rows = await session.scalars(
        select(AsyncJobEvent)
        .where(AsyncJobEvent.job_id == job_id, AsyncJobEvent.id > after)
        .order_by(AsyncJobEvent.id)
        .limit(limit)
    )
    return rows.all()
