"""The cards of a user's day, as input to TIL and quiz generation."""

from __future__ import annotations

import uuid
from datetime import date

from sqlalchemy.ext.asyncio import AsyncSession

from san_ai_worker import repository
from san_ai_worker.ai.schemas import CardInput
from san_common.errors import PermanentJobError
from san_common.til import day_window, user_zone

# Bounds the prompt. The oldest cards of the day win; the rest are not source cards.
MAX_CARDS_PER_DAY = 100


async def load_day_cards(
    session: AsyncSession, user_id: uuid.UUID, day: date
) -> list[repository.DayCard]:
    """The cards created on `day` in the user's time zone; none is bad job data."""
    zone = await user_zone(session, user_id)
    start, end = day_window(zone, day)
    cards = await repository.cards_created_between(session, user_id, start, end, MAX_CARDS_PER_DAY)
    if not cards:
        raise PermanentJobError(f"the user has no knowledge cards on {day} (time zone {zone})")
    return cards


def card_input(card: repository.DayCard) -> CardInput:
    return CardInput(title=card.title, summary=card.summary, tags=card.tags, category=card.category)
