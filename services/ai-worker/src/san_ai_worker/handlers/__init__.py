"""One module per job type; `build_handlers` is the registry the runtime consumes."""

from __future__ import annotations

from typing import Any

from san_ai_worker.ai.provider import AiProvider
from san_ai_worker.handlers.card_analysis import CardAnalysisHandler
from san_ai_worker.handlers.recall_quiz import RecallQuizHandler
from san_ai_worker.handlers.scrap_refine import ScrapRefineHandler
from san_ai_worker.handlers.star_recommendation import StarRecommendationHandler
from san_ai_worker.handlers.til_generation import TilGenerationHandler
from san_common.crypto import TokenCipher
from san_common.github import GithubClient
from san_common.jobs import registry
from san_common.worker import JobHandler


def build_handlers(
    ai: AiProvider, *, github: GithubClient | None = None, cipher: TokenCipher | None = None
) -> dict[str, JobHandler[Any, Any]]:
    """Every AI job type; GITHUB_STAR_RECOMMENDATION only with GitHub access (`main` always
    gives it; test harnesses of the other job types may leave it out)."""
    handlers: list[JobHandler[Any, Any]] = [
        CardAnalysisHandler(ai),
        ScrapRefineHandler(ai),
        TilGenerationHandler(ai),
        RecallQuizHandler(ai),
    ]
    if github is not None and cipher is not None:
        handlers.append(StarRecommendationHandler(ai, github, cipher))
    built = {str(h.job_type): h for h in handlers}
    for job_type in built:
        assert registry.spec_for(job_type).consumer == registry.AI_WORKER, job_type
    return built
