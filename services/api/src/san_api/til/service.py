"""TIL documents (docs/reference/job-rules.md §3.2): starting a generation, reading TILs and their
recall cards."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date

from sqlalchemy.ext.asyncio import AsyncSession

from san_api.cards.service import NeighbourRule, neighbours
from san_api.errors import (
    DateInFuture,
    DuplicateResource,
    NoCardsForDate,
    NotFound,
    TilNotCompleted,
    ValidationFailed,
)
from san_api.til import repository
from san_api.til.schemas import RecallCards, Til, TilPage
from san_common.jobs.registration import DuplicateActiveJob
from san_common.models import DailySummary
from san_common.til import (
    TilInProgress,
    TilStarted,
    day_window,
    local_today,
    start_til_generation,
    user_zone,
)


async def ensure_day_has_cards(session: AsyncSession, user_id: uuid.UUID, day: date) -> None:
    """`day` is not after today and has cards, both in the user's time zone."""
    zone = await user_zone(session, user_id)
    today = local_today(zone)
    if day > today:
        raise DateInFuture(f"{day} is after today ({today}) in the user's time zone ({zone})")
    start, end = day_window(zone, day)
    if not await repository.has_cards_between(session, user_id, start, end):
        raise NoCardsForDate(f"no knowledge cards were saved on {day} (time zone {zone})")


async def request_til(session: AsyncSession, user_id: uuid.UUID, day: date) -> TilStarted:
    await ensure_day_has_cards(session, user_id, day)
    try:
        return await start_til_generation(session, user_id=user_id, target_date=day)
    except TilInProgress as exc:
        raise DuplicateResource(
            "a TIL is already being generated; wait for its job to finish",
            activeJobId=str(exc.job_id),
        ) from exc
    except DuplicateActiveJob as exc:
        raise DuplicateResource(str(exc)) from exc


@dataclass(frozen=True)
class PageRequest:
    day: date | None
    cursor: str | None
    limit: int


async def list_tils(session: AsyncSession, user_id: uuid.UUID, request: PageRequest) -> TilPage:
    before = _decode_cursor(request.cursor) if request.cursor else None
    rows = await repository.page(
        session, user_id, day=request.day, before=before, limit=request.limit + 1
    )
    more, rows = len(rows) > request.limit, rows[: request.limit]
    sources = await repository.source_card_ids(session, [row.id for row in rows])
    return TilPage(
        items=[_view(row, sources[row.id]) for row in rows],
        nextCursor=rows[-1].target_date.isoformat() if more else None,
    )


async def get_til(session: AsyncSession, user_id: uuid.UUID, summary_id: uuid.UUID) -> Til:
    row = await repository.get_for_user(session, summary_id, user_id)
    if row is None:
        raise NotFound(f"TIL {summary_id} not found")
    sources = await repository.source_card_ids(session, [row.id])
    return _view(row, sources[row.id])


async def recall_cards(
    session: AsyncSession, user_id: uuid.UUID, summary_id: uuid.UUID, rule: NeighbourRule
) -> RecallCards:
    """The user's cards near the TIL: within the threshold, else the K nearest; never the
    TIL's own source cards."""
    found, embedding = await repository.embedding_of(session, summary_id, user_id)
    if not found:
        raise NotFound(f"TIL {summary_id} not found")
    if embedding is None:
        raise TilNotCompleted(f"TIL {summary_id} has no generated document yet")
    sources = (await repository.source_card_ids(session, [summary_id]))[summary_id]
    near = await neighbours(session, user_id, embedding, rule, exclude=sources)
    return RecallCards(
        summaryId=summary_id, threshold=rule.threshold, fallback=near.fallback, cards=near.cards
    )


def _decode_cursor(cursor: str) -> date:
    try:
        return date.fromisoformat(cursor)
    except ValueError:
        raise ValidationFailed("cursor is not one this API returned") from None


def _view(row: DailySummary, source_card_ids: list[uuid.UUID]) -> Til:
    return Til(
        summaryId=row.id,
        targetDate=row.target_date,
        status=row.status,
        title=row.title,
        tilMarkdown=row.til_markdown,
        errorMessage=row.error_message,
        sourceCardIds=source_card_ids,
        createdAt=row.created_at,
        updatedAt=row.updated_at,
        completedAt=row.completed_at,
    )
