"""TIL_GENERATION: the day's cards → AI TIL document + embedding → `daily_summaries`
(docs/reference/job-rules.md §3.2).

Two AI calls: when the embedding call fails after the chat call answered, the TIL is kept
as the job's checkpoint and the next try only asks for the embedding (as card analysis)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from san_ai_worker import repository
from san_ai_worker.ai.provider import AiProvider
from san_ai_worker.ai.schemas import CardInput, Til
from san_ai_worker.handlers.day_cards import card_input, load_day_cards
from san_common.errors import JobFailure, PermanentJobError
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, handles

_CHECKPOINT_KEY = "til"


@dataclass(frozen=True)
class _Day:
    target_date: date
    card_ids: list[uuid.UUID]
    cards: list[CardInput]


@dataclass(frozen=True)
class _Written:
    til: Til
    embedding: list[float]
    card_ids: list[uuid.UUID]


@handles(JobType.TIL_GENERATION)
class TilGenerationHandler(JobHandler[_Day, _Written]):
    def __init__(self, ai: AiProvider) -> None:
        self._ai = ai

    async def load(self, session: AsyncSession, job: AsyncJob) -> _Day:
        summary = await repository.get_summary(session, job.target_id)
        if summary is None:
            raise PermanentJobError(f"daily summary {job.target_id} does not exist")
        cards = await load_day_cards(session, summary.user_id, summary.target_date)
        return _Day(summary.target_date, [c.card_id for c in cards], [card_input(c) for c in cards])

    async def run(self, job: AsyncJob, day: _Day) -> _Written:
        til = _from_checkpoint(job) or await self._ai.write_til(day.target_date, day.cards)
        try:
            embedding = await self._ai.embed(f"{til.title}\n\n{til.tilMarkdown}")
        except JobFailure as exc:
            # The next try keeps this answer: it was paid for, and would not be the same.
            exc.checkpoint = {_CHECKPOINT_KEY: til.model_dump(mode="json")}
            raise
        return _Written(til, embedding, day.card_ids)

    async def store(self, session: AsyncSession, job: AsyncJob, written: _Written) -> None:
        stored = await repository.complete_summary(
            session,
            job.target_id,
            title=written.til.title,
            til_markdown=written.til.tilMarkdown,
            embedding=written.embedding,
            card_ids=written.card_ids,
        )
        if not stored:
            raise PermanentJobError(f"daily summary {job.target_id} was deleted during generation")


def _from_checkpoint(job: AsyncJob) -> Til | None:
    saved = (job.checkpoint or {}).get(_CHECKPOINT_KEY)
    if saved is None:
        return None
    try:
        return Til.model_validate(saved)
    except ValidationError:
        return None  # an older shape: ask again
