"""One module per job type; `build_handlers` is the registry the runtime consumes."""

from __future__ import annotations

from san_ai_worker.ai.provider import AiProvider
from san_ai_worker.handlers.card_analysis import CardAnalysisHandler
from san_ai_worker.handlers.scrap_refine import ScrapRefineHandler
from san_common.jobs.types import JobType
from san_common.worker import JobHandler


def build_handlers(ai: AiProvider) -> dict[JobType, JobHandler]:
    handlers: list[JobHandler] = [CardAnalysisHandler(ai), ScrapRefineHandler(ai)]
    return {h.job_type: h for h in handlers}
