from __future__ import annotations

import uuid
from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel

import san_common.jobs.repository as jobs
from san_api.deps import CurrentUser, SessionDep
from san_api.errors import NotFound
from san_common.jobs.types import JobStatus

router = APIRouter(tags=["jobs"])


class JobView(BaseModel):
    jobId: uuid.UUID
    jobType: str
    status: str
    # Sanitized summaries (san_common.errors.summarize): why the job FAILED, and why its
    # latest try failed (also while a retry waits). The full cause chain is for operators
    # (logs, `async_jobs.error_message`), never for clients.
    errorMessage: str | None
    targetId: uuid.UUID
    attempt: int
    tries: int
    nextAttemptAt: datetime | None
    lastError: str | None
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
        errorMessage=job.error_summary if job.status == JobStatus.FAILED.value else None,
        targetId=job.target_id,
        attempt=job.attempt,
        tries=job.tries,
        nextAttemptAt=job.next_attempt_at,
        lastError=job.error_summary,
        createdAt=job.created_at,
        updatedAt=job.updated_at,
        startedAt=job.started_at,
        finishedAt=job.finished_at,
    )
