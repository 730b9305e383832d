from __future__ import annotations

import uuid

from fastapi import APIRouter, status

from san_api import errors
from san_api.deps import CurrentUser, SessionDep
from san_api.limits.dependencies import job_limits
from san_api.openapi import problems
from san_api.recall_quizzes import service
from san_api.recall_quizzes.schemas import (
    RecallQuizAccepted,
    RecallQuizCreate,
    RecallQuizGeneration,
)
from san_common.jobs.types import JobType

router = APIRouter(tags=["recall quizzes"])


@router.post(
    "/recall-quizzes",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RecallQuizAccepted,
    dependencies=job_limits("recall-quizzes", ai_jobs=(JobType.RECALL_QUIZ_GENERATION,)),
    responses=problems(errors.DateInFuture, errors.NoCardsForDate),
)
async def create_recall_quizzes(
    body: RecallQuizCreate, user: CurrentUser, session: SessionDep
) -> RecallQuizAccepted:
    """Generate recall quizzes of the given types from a day's cards."""
    started = await service.request_quizzes(session, user.user_id, body.targetDate, body.quizTypes)
    return RecallQuizAccepted(
        generationId=started.generation_id, jobId=started.job_id, targetId=started.generation_id
    )


@router.get("/recall-quizzes/{generationId}", response_model=RecallQuizGeneration)
async def get_recall_quizzes(
    generationId: uuid.UUID, user: CurrentUser, session: SessionDep
) -> RecallQuizGeneration:
    """The generation's status and, once COMPLETED, its quizzes in order."""
    return await service.get_generation(session, user.user_id, generationId)
