"""`POST/GET /github-star-recommendations` (docs/reference/job-rules.md §3.5). The job's target is
the user; the ai-worker replaces the user's recommendations when a job completes, so the newest
completed job's rows are the ones served."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from san_api import errors
from san_api.github import repository
from san_common.jobs import repository as jobs
from san_common.jobs.registration import DuplicateActiveJob, register_job_in_transaction
from san_common.jobs.types import JobType
from san_common.models import GithubStarRecommendation


@dataclass(frozen=True)
class LatestRecommendations:
    job_id: uuid.UUID | None
    generated_at: datetime | None
    recommendations: list[GithubStarRecommendation]


async def request_recommendations(session: AsyncSession, user_id: uuid.UUID) -> uuid.UUID:
    if await repository.get_account(session, user_id) is None:
        raise errors.GithubNotLinked("link GitHub first: the recommendations come from your stars")
    try:
        job = await register_job_in_transaction(
            session, job_type=JobType.GITHUB_STAR_RECOMMENDATION, target_id=user_id, user_id=user_id
        )
    except DuplicateActiveJob:
        active = await jobs.find_active(session, user_id, JobType.GITHUB_STAR_RECOMMENDATION)
        extra: dict[str, Any] = {"jobId": str(active.job_id)} if active else {}
        raise errors.DuplicateResource(
            "a star recommendation is already in progress", **extra
        ) from None
    return job.job_id


async def latest(session: AsyncSession, user_id: uuid.UUID) -> LatestRecommendations:
    job = await repository.latest_star_job(session, user_id)
    if job is None:
        return LatestRecommendations(None, None, [])
    rows = await repository.star_recommendations(session, user_id, job.job_id)
    return LatestRecommendations(job.job_id, job.finished_at, rows)
