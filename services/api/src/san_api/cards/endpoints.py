from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from san_api.cards import service
from san_api.cards.schemas import Card, SimilarCards
from san_api.deps import CurrentUser, SessionDep, SettingsDep

router = APIRouter(tags=["cards"])


@router.get("/cards/{scrapId}", response_model=Card)
async def get_card_for_scrap(scrapId: uuid.UUID, user: CurrentUser, session: SessionDep) -> Card:
    """The knowledge card made from a scrap; 404 until its CARD_ANALYSIS job completes."""
    return await service.card_for_scrap(session, scrapId, user.user_id)


@router.get("/cards/{cardId}/similar-cards", response_model=SimilarCards)
async def get_similar_cards(
    cardId: uuid.UUID,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    limit: Annotated[int | None, Query(ge=1, le=100, description="K of the fallback")] = None,
) -> SimilarCards:
    rule = service.NeighbourRule(
        settings.similar_cards_threshold, limit or settings.similar_cards_k
    )
    return await service.similar_cards(session, cardId, user.user_id, rule)
