from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from san_api.deps import SubjectDep
from san_api.errors import BudgetExceeded, RateLimited, TooManyActiveJobs
from san_api.limits.dependencies import LimitedTransaction
from san_api.openapi import problems
from san_api.scraps import service
from san_api.scraps.schemas import ScrapAccepted, ScrapCreate
from san_api.settings import ApiSettings
from san_common.jobs.types import JobType

router = APIRouter(tags=["scraps"])

# rate limit, transaction, user, active-job cap (two jobs a scrap)
_LIMITS = LimitedTransaction("scraps", 2, (JobType.CARD_ANALYSIS, JobType.SCRAP_REFINE))


@router.post(
    "/scraps",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ScrapAccepted,
    responses=problems(RateLimited, TooManyActiveJobs, BudgetExceeded),
)
async def create_scrap(body: ScrapCreate, request: Request, subject: SubjectDep) -> Response:
    """Save a scrap; its knowledge card and refined text are produced by async jobs."""
    settings: ApiSettings = request.app.state.settings
    async with _LIMITS.open(request, subject) as job:
        saved = await service.save_scrap(
            job.connection,
            job.user.user_id,
            body.content,
            max_bytes=settings.scrap_max_bytes,
            direct=job.direct,
        )
    accepted = ScrapAccepted(
        scrapId=saved.scrap_id,
        analysisJobId=saved.analysis_job_id,
        refineJobId=saved.refine_job_id,
        duplicate=saved.duplicate,
    )
    # serialized once, here: returning the model would have FastAPI validate it again
    return Response(
        accepted.model_dump_json(), status.HTTP_202_ACCEPTED, media_type="application/json"
    )
