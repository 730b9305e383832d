"""RECALL_QUIZ_GENERATION: the day's cards → AI quizzes of the requested types
(docs/reference/job-rules.md §3.4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from san_ai_worker import repository
from san_ai_worker.ai.provider import AiProvider
from san_ai_worker.ai.schemas import CardInput, Quiz
from san_ai_worker.handlers.day_cards import card_input, load_day_cards
from san_common.errors import PermanentJobError
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, handles


@dataclass(frozen=True)
class _Request:
    quiz_types: list[str]
    cards: list[CardInput]


@handles(JobType.RECALL_QUIZ_GENERATION)
class RecallQuizHandler(JobHandler[_Request, list[repository.NewQuiz]]):
    def __init__(self, ai: AiProvider) -> None:
        self._ai = ai

    async def load(self, session: AsyncSession, job: AsyncJob) -> _Request:
        generation = await repository.get_generation(session, job.target_id)
        if generation is None:
            raise PermanentJobError(f"recall quiz generation {job.target_id} does not exist")
        cards = await load_day_cards(session, generation.user_id, generation.target_date)
        return _Request(list(generation.quiz_types), [card_input(c) for c in cards])

    async def run(self, job: AsyncJob, request: _Request) -> list[repository.NewQuiz]:
        answer = await self._ai.make_quizzes(request.cards, request.quiz_types)
        check_quizzes(answer.quizzes, request.quiz_types)
        return [
            repository.NewQuiz(q.type, q.question, q.answer, q.explanation) for q in answer.quizzes
        ]

    async def store(
        self, session: AsyncSession, job: AsyncJob, quizzes: list[repository.NewQuiz]
    ) -> None:
        if not await repository.complete_generation(session, job.target_id, quizzes):
            raise PermanentJobError(
                f"recall quiz generation {job.target_id} was deleted during generation"
            )


def check_quizzes(quizzes: Sequence[Quiz], requested: Sequence[str]) -> None:
    """Only requested types, and at least one of each: whatever the provider promised."""
    unrequested = sorted({q.type for q in quizzes} - set(requested))
    if unrequested:
        raise PermanentJobError(
            f"AI quizzes have unrequested type {', '.join(unrequested)} "
            f"(requested {', '.join(requested)})"
        )
    missing = [t for t in requested if not any(q.type == t for q in quizzes)]
    if missing:
        raise PermanentJobError(
            f"AI quizzes have no {', '.join(missing)} quiz (requested {', '.join(requested)})"
        )
