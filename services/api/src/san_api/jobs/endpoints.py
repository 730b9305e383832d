from __future__ import annotations

import uuid
from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel

import san_common.jobs.repository as jobs
from san_api.deps import CurrentUser, SessionDep
from san_api.errors import NotFound

router = APIRouter(tags=["jobs"])


class JobView(BaseModel):
    jobId: uuid.UUID
    jobType: str
    status: str
    errorMessage: str | None
    targetId: uuid.UUID
    attempt: int
    createdAt: datetime
    updatedAt: datetime
    startedAt: datetime | None
    finishedAt: datetime | None


@router.get("/async-jobs/{jobId}", response_model=JobView)
async def get_job(jobId: uuid.UUID, user: CurrentUser, session: SessionDep) -> JobView:
    """Poll a job. Only its owner sees it; anyone else gets 404."""
    job = await jobs.get_for_user(session, jobId, user.user_id)
    if job is None:
        raise NotFound(f"job {jobId} not found")
    return JobView(
        jobId=job.job_id,
        jobType=job.job_type,
        status=job.status,
        errorMessage=job.error_message,
        targetId=job.target_id,
        attempt=job.attempt,
        createdAt=job.created_at,
        updatedAt=job.updated_at,
        startedAt=job.started_at,
        finishedAt=job.finished_at,
    )
