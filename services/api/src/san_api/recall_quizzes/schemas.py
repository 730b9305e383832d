from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from san_api.til.schemas import IsoDate

QuizType = Literal["OX", "SHORT_ANSWER"]


def _distinct(types: list[QuizType]) -> list[QuizType]:
    if len(set(types)) != len(types):
        raise ValueError("quiz types must not repeat")
    return types


class RecallQuizCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targetDate: IsoDate = Field(description="The day (in the user's time zone) to quiz on")
    quizTypes: Annotated[list[QuizType], Field(min_length=1), AfterValidator(_distinct)]


class RecallQuizAccepted(BaseModel):
    generationId: uuid.UUID
    jobId: uuid.UUID
    targetId: uuid.UUID = Field(description="The job's target: the generation id")


class RecallQuiz(BaseModel):
    quizId: uuid.UUID
    position: int
    type: QuizType
    question: str
    answer: str
    explanation: str


class RecallQuizGeneration(BaseModel):
    generationId: uuid.UUID
    targetDate: date
    quizTypes: list[str]
    status: str = Field(description="PENDING, PROCESSING, COMPLETED or FAILED")
    errorMessage: str | None
    createdAt: datetime
    updatedAt: datetime
    completedAt: datetime | None
    quizzes: list[RecallQuiz] = Field(description="Empty until the generation is COMPLETED")
