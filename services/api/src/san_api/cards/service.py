"""Reading knowledge cards and their neighbours (SPEC §3.1)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

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


async def similar_cards(
    session: AsyncSession, card_id: uuid.UUID, user_id: uuid.UUID, rule: NeighbourRule
) -> SimilarCards:
    """Cards within `threshold` cosine distance; if none, the K nearest. Never the card itself."""
    embedding = await repository.get_embedding(session, card_id, user_id)
    if embedding is None:
        raise NotFound(f"card {card_id} not found")
    neighbours = await repository.nearest(session, user_id, embedding, rule.k, exclude=[card_id])
    within = [(card, d) for card, d in neighbours if d <= rule.threshold]
    chosen = within or neighbours
    return SimilarCards(
        cardId=card_id,
        threshold=rule.threshold,
        fallback=not within and bool(neighbours),
        cards=[
            SimilarCard(
                cardId=card.id,
                scrapId=card.scrap_id,
                title=card.title,
                summary=card.summary,
                distance=round(distance, 6),
            )
            for card, distance in chosen
        ],
    )
