from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, status

from san_api.deps import SettingsDep
from san_api.limits.dependencies import JobRequest, limited_transaction
from san_api.scraps import service
from san_api.scraps.schemas import ScrapAccepted, ScrapCreate
from san_common.jobs.types import JobType

router = APIRouter(tags=["scraps"])

# rate limit, transaction, user, active-job cap (two jobs a scrap)
ScrapRequest = Annotated[
    JobRequest,
    limited_transaction("scraps", jobs=2, ai_jobs=(JobType.CARD_ANALYSIS, JobType.SCRAP_REFINE)),
]


@router.post("/scraps", status_code=status.HTTP_202_ACCEPTED, response_model=ScrapAccepted)
async def create_scrap(
    body: ScrapCreate, job_request: ScrapRequest, settings: SettingsDep
) -> ScrapAccepted:
    """Save a scrap; its knowledge card and refined text are produced by async jobs."""
    saved = await service.save_scrap(
        job_request.connection,
        job_request.user.user_id,
        body.content,
        max_bytes=settings.scrap_max_bytes,
        direct=job_request.direct,
    )
    return ScrapAccepted(
        scrapId=saved.scrap_id,
        analysisJobId=saved.analysis_job_id,
        refineJobId=saved.refine_job_id,
        duplicate=saved.duplicate,
    )
