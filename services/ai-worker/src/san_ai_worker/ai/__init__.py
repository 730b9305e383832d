"""AI providers: an OpenAI-compatible HTTP client and an offline deterministic stand-in."""

from san_ai_worker.ai.local import LocalProvider
from san_ai_worker.ai.openai import OpenAICompatibleProvider
from san_ai_worker.ai.provider import AiProvider, build_provider
from san_ai_worker.ai.schemas import (
    CardAnalysis,
    CardInput,
    Quiz,
    RecallQuizSet,
    ScrapRefine,
    StarInput,
    StarRecommendation,
    StarRecommendations,
    Til,
)

__all__ = [
    "AiProvider",
    "CardAnalysis",
    "CardInput",
    "LocalProvider",
    "OpenAICompatibleProvider",
    "Quiz",
    "RecallQuizSet",
    "ScrapRefine",
    "StarInput",
    "StarRecommendation",
    "StarRecommendations",
    "Til",
    "build_provider",
]
