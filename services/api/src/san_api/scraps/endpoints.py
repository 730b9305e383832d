from __future__ import annotations

from fastapi import APIRouter, status

from san_api.deps import ConnectionDep, CurrentUserOnConnection, SettingsDep
from san_api.limits.dependencies import job_limits
from san_api.scraps import service
from san_api.scraps.schemas import ScrapAccepted, ScrapCreate

router = APIRouter(tags=["scraps"])


@router.post(
    "/scraps",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ScrapAccepted,
    dependencies=job_limits("scraps", jobs=2, on_connection=True),
)
async def create_scrap(
    body: ScrapCreate,
    user: CurrentUserOnConnection,
    connection: ConnectionDep,
    settings: SettingsDep,
) -> ScrapAccepted:
    """Save a scrap; its knowledge card and refined text are produced by async jobs."""
    saved = await service.save_scrap(
        connection, user.user_id, body.content, max_bytes=settings.scrap_max_bytes
    )
    return ScrapAccepted(
        scrapId=saved.scrap_id,
        analysisJobId=saved.analysis_job_id,
        refineJobId=saved.refine_job_id,
        duplicate=saved.duplicate,
    )
