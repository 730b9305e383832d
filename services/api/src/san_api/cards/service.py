"""Reading knowledge cards and their neighbours (docs/reference/job-rules.md §3.1)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from san_api.cards import repository
from san_api.cards.schemas import Card, SimilarCard, SimilarCards
from san_api.errors import NotFound


async def card_for_scrap(session: AsyncSession, scrap_id: uuid.UUID, user_id: uuid.UUID) -> Card:
    row = await repository.get_by_scrap(session, scrap_id, user_id)
    if row is None:
        raise NotFound(f"no knowledge card for scrap {scrap_id} (yet)")
    card, category = row
    return Card(
        cardId=card.id,
        scrapId=card.scrap_id,
        title=card.title,
        summary=card.summary,
        category=category,
        tags=await repository.tag_names(session, card.id),
        createdAt=card.created_at,
    )


@dataclass(frozen=True)
class NeighbourRule:
    threshold: float
    k: int


@dataclass(frozen=True)
class Neighbours:
    fallback: bool
    cards: list[SimilarCard]


async def neighbours(
    session: AsyncSession,
    user_id: uuid.UUID,
    embedding: Any,
    rule: NeighbourRule,
    exclude: Sequence[uuid.UUID],
) -> Neighbours:
    """The user's cards within `rule.threshold` cosine distance of `embedding`; if none, the
    K nearest (`fallback`). Shared by similar cards and a TIL's recall cards
    (docs/reference/job-rules.md §3.1, §3.2)."""
    nearest = await repository.nearest(session, user_id, embedding, rule.k, exclude=exclude)
    within = [n for n in nearest if n.distance <= rule.threshold]
    return Neighbours(
        fallback=not within and bool(nearest),
        cards=[
            SimilarCard(
                cardId=n.card_id,
                scrapId=n.scrap_id,
                title=n.title,
                summary=n.summary,
                distance=round(n.distance, 6),
            )
            for n in (within or nearest)
        ],
    )


async def similar_cards(
    session: AsyncSession, card_id: uuid.UUID, user_id: uuid.UUID, rule: NeighbourRule
) -> SimilarCards:
    """Cards near this one by the neighbour rule; never the card itself."""
    query = repository.CardEmbedding(card_id)
    found = await neighbours(session, user_id, query, rule, exclude=[card_id])
    # No neighbour at all: a lone card, or no such card of this user (asked only then).
    if not found.cards and not await repository.exists(session, card_id, user_id):
        raise NotFound(f"card {card_id} not found")
    return SimilarCards(
        cardId=card_id, threshold=rule.threshold, fallback=found.fallback, cards=found.cards
    )
