"""Answers of the AI (wire names of docs/reference/job-rules.md §8) and the inputs the providers
take."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from san_common.errors import PermanentJobError

QUIZ_TYPES: Final = ("OX", "SHORT_ANSWER")
MAX_TAGS: Final = 10


def _non_blank(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("must not be blank")
    return value


NonBlank = Annotated[str, AfterValidator(_non_blank)]


class _Answer(BaseModel):
    # `additionalProperties: false` in the JSON schema is what strict structured output wants;
    # validation itself ignores extras, since a lenient server may add some.
    model_config = ConfigDict(
        frozen=True, extra="ignore", json_schema_extra={"additionalProperties": False}
    )


class CardAnalysis(_Answer):
    title: NonBlank
    summary: NonBlank
    tags: list[str]
    category: NonBlank

    @field_validator("tags")
    @classmethod
    def _normalize_tags(cls, tags: list[str]) -> list[str]:
        normalized: list[str] = []
        for tag in tags:
            tag = " ".join(tag.split()).lower().lstrip("#")
            if not tag:
                raise ValueError("a tag must not be blank")
            if tag not in normalized:
                normalized.append(tag)
        return normalized[:MAX_TAGS]


class ScrapRefine(_Answer):
    refinedContent: NonBlank


class Til(_Answer):
    title: NonBlank
    tilMarkdown: NonBlank


class Quiz(_Answer):
    type: Literal["OX", "SHORT_ANSWER"]
    question: NonBlank
    answer: NonBlank
    explanation: str


class RecallQuizSet(_Answer):
    quizzes: list[Quiz]


class StarRecommendation(_Answer):
    repoFullName: NonBlank
    reason: NonBlank
    score: Annotated[float, Field(allow_inf_nan=False)]


class StarRecommendations(_Answer):
    recommendations: list[StarRecommendation]


def check_quiz_types(quiz_types: Sequence[str]) -> tuple[str, ...]:
    """The requested quiz types, deduplicated; unknown or none is bad job data."""
    requested = tuple(dict.fromkeys(t.strip().upper() for t in quiz_types))
    if not requested or any(t not in QUIZ_TYPES for t in requested):
        raise PermanentJobError(
            f"quiz types must be a non-empty subset of {'/'.join(QUIZ_TYPES)}, "
            f"got {list(quiz_types)}"
        )
    return requested


@dataclass(frozen=True, slots=True)
class CardInput:
    """A knowledge card as input to TIL and quiz generation."""

    title: str
    summary: str
    tags: list[str]
    category: str | None


@dataclass(frozen=True, slots=True)
class StarInput:
    """A starred GitHub repository as input to recommendations."""

    full_name: str
    description: str | None
    topics: list[str]
    language: str | None
    html_url: str
