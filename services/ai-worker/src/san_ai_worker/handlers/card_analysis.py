"""CARD_ANALYSIS: scrap text → AI analysis + embedding → knowledge card (docs/reference/job-rules.md
§3.1).

Two AI calls. When the chat call succeeded and the embedding call failed, the failure
carries the analysis as the job's checkpoint, so the next try only asks for the embedding
(the chat call is the slow, costly one and its answer would not be the same twice).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from san_ai_worker import repository
from san_ai_worker.ai.provider import AiProvider
from san_ai_worker.ai.schemas import CardAnalysis
from san_common.errors import JobFailure, PermanentJobError
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, Scrap
from san_common.worker import JobHandler, handles

_CHECKPOINT_KEY = "analysis"


@dataclass(frozen=True)
class _Analysed:
    analysis: CardAnalysis
    embedding: list[float]


@handles(JobType.CARD_ANALYSIS)
class CardAnalysisHandler(JobHandler[Scrap | None, _Analysed | None]):
    def __init__(self, ai: AiProvider) -> None:
        self._ai = ai

    async def load(self, session: AsyncSession, job: AsyncJob) -> Scrap | None:
        scrap = await repository.get_scrap(session, job.target_id)
        if scrap is None:
            raise PermanentJobError(f"scrap {job.target_id} does not exist")
        if await repository.card_exists(session, scrap.id):
            return None  # done by an earlier attempt: complete without calling the AI again
        return scrap

    async def run(self, job: AsyncJob, scrap: Scrap | None) -> _Analysed | None:
        if scrap is None:
            return None
        analysis = _from_checkpoint(job) or await self._ai.analyze_card(scrap.content)
        try:
            embedding = await self._ai.embed(scrap.content)
        except JobFailure as exc:
            exc.checkpoint = {_CHECKPOINT_KEY: analysis.model_dump(mode="json")}
            raise
        return _Analysed(analysis, embedding)

    async def store(self, session: AsyncSession, job: AsyncJob, result: _Analysed | None) -> None:
        if result is None:
            return
        scrap = await repository.get_scrap(session, job.target_id)
        if scrap is None:
            raise PermanentJobError(f"scrap {job.target_id} was deleted during analysis")
        analysis = result.analysis
        category_id = await repository.find_or_create_category(
            session, scrap.user_id, analysis.category
        )
        card_id = await repository.insert_card(
            session,
            scrap=scrap,
            category_id=category_id,
            title=analysis.title,
            summary=analysis.summary,
            embedding=result.embedding,
        )
        if card_id is not None:
            tag_ids = await repository.find_or_create_tags(session, scrap.user_id, analysis.tags)
            await repository.link_tags(session, card_id, tag_ids)


def _from_checkpoint(job: AsyncJob) -> CardAnalysis | None:
    saved = (job.checkpoint or {}).get(_CHECKPOINT_KEY)
    if saved is None:
        return None
    try:
        return CardAnalysis.model_validate(saved)
    except ValidationError:
        return None  # an older shape: ask again
