from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import Category, KnowledgeCard, Tag, card_tags


async def get_by_scrap(
    session: AsyncSession, scrap_id: uuid.UUID, user_id: uuid.UUID
) -> Row[KnowledgeCard, str] | None:
    result = await session.execute(
        select(KnowledgeCard, Category.name)
        .outerjoin(Category, Category.id == KnowledgeCard.category_id)
        .where(KnowledgeCard.scrap_id == scrap_id, KnowledgeCard.user_id == user_id)
    )
    return result.one_or_none()


async def tag_names(session: AsyncSession, card_id: uuid.UUID) -> list[str]:
    result = await session.scalars(
        select(Tag.name)
        .join(card_tags, card_tags.c.tag_id == Tag.id)
        .where(card_tags.c.card_id == card_id)
        .order_by(Tag.name)
    )
    return list(result)


async def get_embedding(
    session: AsyncSession, card_id: uuid.UUID, user_id: uuid.UUID
) -> Any | None:
    return await session.scalar(
        select(KnowledgeCard.embedding).where(
            KnowledgeCard.id == card_id, KnowledgeCard.user_id == user_id
        )
    )


async def nearest(
    session: AsyncSession,
    user_id: uuid.UUID,
    embedding: Any,
    k: int,
    exclude: Sequence[uuid.UUID],
) -> list[tuple[KnowledgeCard, float]]:
    """The user's K cards nearest by cosine distance, through the HNSW index.

    `iterative_scan` keeps scanning the index when the user filter discards candidates, so
    a user with few cards among many still gets K results (pgvector ≥ 0.8).
    """
    await session.execute(text("SET LOCAL hnsw.ef_search = 100"))
    await session.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))
    distance = KnowledgeCard.embedding.cosine_distance(embedding).label("distance")
    query = select(KnowledgeCard, distance).where(KnowledgeCard.user_id == user_id)
    if exclude:
        query = query.where(KnowledgeCard.id.not_in(exclude))
    result = await session.execute(query.order_by(distance).limit(k))
    # relaxed_order may return neighbours slightly out of order
    return sorted(((row[0], float(row[1])) for row in result), key=lambda pair: pair[1])
