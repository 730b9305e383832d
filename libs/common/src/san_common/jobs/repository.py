"""Reads of `async_jobs` shared by the API, the workers and recovery. Every change of a
job's status, and every write of its tries, is in `jobs.lifecycle`."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.types import ACTIVE_STATUSES, JobType
from san_common.models import AsyncJob, AsyncJobTry


async def get_for_user(
    session: AsyncSession, job_id: uuid.UUID, user_id: uuid.UUID
) -> AsyncJob | None:
    return await session.scalar(
        select(AsyncJob).where(AsyncJob.job_id == job_id, AsyncJob.user_id == user_id)
    )


async def find_active(
    session: AsyncSession, target_id: uuid.UUID, job_type: JobType | str
) -> AsyncJob | None:
    return await session.scalar(
        select(AsyncJob).where(
            AsyncJob.target_id == target_id,
            AsyncJob.job_type == str(job_type),
            AsyncJob.status.in_([s.value for s in ACTIVE_STATUSES]),
        )
    )


async def tries_of(session: AsyncSession, job_id: uuid.UUID) -> list[AsyncJobTry]:
    return list(
        await session.scalars(
            select(AsyncJobTry).where(AsyncJobTry.job_id == job_id).order_by(AsyncJobTry.try_no)
        )
    )
