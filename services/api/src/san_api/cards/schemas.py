from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel


class Card(BaseModel):
    cardId: uuid.UUID
    scrapId: uuid.UUID
    title: str
    summary: str
    category: str | None
    tags: list[str]
    createdAt: datetime


class SimilarCard(BaseModel):
    cardId: uuid.UUID
    scrapId: uuid.UUID
    title: str
    summary: str
    distance: float


class SimilarCards(BaseModel):
    cardId: uuid.UUID
    threshold: float
    fallback: bool
    """True when no card was within the threshold and the K nearest are returned instead."""
    cards: list[SimilarCard]
