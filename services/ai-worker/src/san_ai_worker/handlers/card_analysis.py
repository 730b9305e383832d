"""CARD_ANALYSIS: scrap text → AI analysis + embedding → knowledge card (SPEC §3.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sqlalchemy.ext.asyncio import AsyncSession

from san_ai_worker import repository
from san_ai_worker.ai.provider import AiProvider
from san_ai_worker.ai.schemas import CardAnalysis
from san_common.errors import PermanentJobError
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, Scrap


@dataclass(frozen=True)
class _Analysed:
    analysis: CardAnalysis
    embedding: list[float]


class CardAnalysisHandler:
    job_type: ClassVar[JobType] = JobType.CARD_ANALYSIS

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
        analysis = await self._ai.analyze_card(scrap.content)
        embedding = await self._ai.embed(scrap.content)
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
