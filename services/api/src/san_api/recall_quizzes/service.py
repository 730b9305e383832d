"""Recall quizzes (docs/reference/job-rules.md §3.4): starting a generation for a day, reading its
quizzes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import date

from sqlalchemy.ext.asyncio import AsyncSession

from san_api.errors import NotFound
from san_api.recall_quizzes import repository
from san_api.recall_quizzes.schemas import RecallQuiz, RecallQuizGeneration
from san_api.til.service import ensure_day_has_cards
from san_common.til import QuizStarted, start_quiz_generation


async def request_quizzes(
    session: AsyncSession, user_id: uuid.UUID, day: date, quiz_types: Sequence[str]
) -> QuizStarted:
    await ensure_day_has_cards(session, user_id, day)
    return await start_quiz_generation(
        session, user_id=user_id, target_date=day, quiz_types=quiz_types
    )


async def get_generation(
    session: AsyncSession, user_id: uuid.UUID, generation_id: uuid.UUID
) -> RecallQuizGeneration:
    generation = await repository.get_for_user(session, generation_id, user_id)
    if generation is None:
        raise NotFound(f"recall quiz generation {generation_id} not found")
    quizzes = await repository.quizzes_of(session, generation.id)
    return RecallQuizGeneration(
        generationId=generation.id,
        targetDate=generation.target_date,
        quizTypes=list(generation.quiz_types),
        status=generation.status,
        errorMessage=generation.error_message,
        createdAt=generation.created_at,
        updatedAt=generation.updated_at,
        completedAt=generation.completed_at,
        quizzes=[
            RecallQuiz(
                quizId=quiz.id,
                position=quiz.position,
                type=quiz.quiz_type,  # the table's CHECK constraint guarantees a QuizType
                question=quiz.question,
                answer=quiz.answer,
                explanation=quiz.explanation,
            )
            for quiz in quizzes
        ],
    )
