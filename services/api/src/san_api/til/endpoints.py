from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, status

from san_api import errors
from san_api.cards.service import NeighbourRule
from san_api.deps import CurrentUser, SessionDep, SettingsDep
from san_api.limits.dependencies import job_limits
from san_api.openapi import problems
from san_api.til import service
from san_api.til.schemas import IsoDate, RecallCards, Til, TilAccepted, TilCreate, TilPage
from san_common.jobs.types import JobType

router = APIRouter(tags=["til"])


@router.post(
    "/til",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TilAccepted,
    dependencies=job_limits("til", ai_jobs=(JobType.TIL_GENERATION,)),
    responses=problems(errors.DateInFuture, errors.NoCardsForDate, errors.DuplicateResource),
)
async def create_til(body: TilCreate, user: CurrentUser, session: SessionDep) -> TilAccepted:
    """Generate (or regenerate) the TIL of a day that has cards; 409 while any TIL of the
    user is being generated."""
    started = await service.request_til(session, user.user_id, body.targetDate)
    return TilAccepted(
        summaryId=started.summary_id, jobId=started.job_id, targetId=started.summary_id
    )


@router.get("/til", response_model=TilPage)
async def list_tils(
    user: CurrentUser,
    session: SessionDep,
    date: Annotated[IsoDate | None, Query(description="Only the TIL of this day")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=64, description="nextCursor of a page")] = None,
) -> TilPage:
    """The user's TILs, newest target date first."""
    return await service.list_tils(session, user.user_id, service.PageRequest(date, cursor, limit))


@router.get("/til/{summaryId}", response_model=Til)
async def get_til(summaryId: uuid.UUID, user: CurrentUser, session: SessionDep) -> Til:
    return await service.get_til(session, user.user_id, summaryId)


@router.get(
    "/til/{summaryId}/recall-cards",
    response_model=RecallCards,
    responses=problems(errors.TilNotCompleted),
)
async def get_recall_cards(
    summaryId: uuid.UUID,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    limit: Annotated[int | None, Query(ge=1, le=100, description="K of the fallback")] = None,
) -> RecallCards:
    """Cards near the TIL (cosine distance ≤ threshold, else the K nearest), excluding the
    cards it was written from."""
    rule = NeighbourRule(settings.similar_cards_threshold, limit or settings.similar_cards_k)
    return await service.recall_cards(session, user.user_id, summaryId, rule)
