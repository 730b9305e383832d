from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, ScalarSelect, Select, select, text
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


async def exists(session: AsyncSession, card_id: uuid.UUID, user_id: uuid.UUID) -> bool:
    found = await session.scalar(
        select(KnowledgeCard.id).where(
            KnowledgeCard.id == card_id, KnowledgeCard.user_id == user_id
        )
    )
    return found is not None


def embedding_of(card_id: uuid.UUID, user_id: uuid.UUID) -> ScalarSelect[Any]:
    """The card's embedding as a scalar subquery: the query vector stays in the database
    (no 1536 floats parsed into Python and sent back), and an HNSW scan still takes it."""
    return (
        select(KnowledgeCard.embedding)
        .where(KnowledgeCard.id == card_id, KnowledgeCard.user_id == user_id)
        .scalar_subquery()
    )


@dataclass(frozen=True)
class Neighbour:
    card_id: uuid.UUID
    scrap_id: uuid.UUID
    title: str
    summary: str
    distance: float


# The approximate search, through the HNSW index. The planner would not take the index on
# its own: it prices the HNSW path above a (parallel) sequential scan because it counts the
# table's pages, not the ~400k TOASTed embedding reads the scan really costs, so at 100k
# cards of one user it ran the exact scan (~210 ms) instead of the index (~2 ms). With sorts
# disabled, the only plan left that yields `ORDER BY distance` is the index's own order.
# `set_config(…, true)` is SET LOCAL (the transaction's); reset right after the query, so
# nothing else in the request is planned under these settings.
# ef_search 200 with iterative scan: recall@10 ≥ 0.95 on clustered embeddings at 100k cards
# (benchmarks/similar_cards.py measures it against the exact scan on every `make bench`).
HNSW_EF_SEARCH = 200
# The select list runs left to right: the first column is enable_sort as it was.
_APPROXIMATE = text(
    "SELECT current_setting('enable_sort'),"
    " set_config('hnsw.ef_search', :ef_search, true),"
    " set_config('hnsw.iterative_scan', 'relaxed_order', true),"
    " set_config('enable_sort', 'off', true)"
)
_RESET = text("SELECT set_config('enable_sort', :enable_sort, true)")


async def nearest(
    session: AsyncSession,
    user_id: uuid.UUID,
    embedding: Any,
    k: int,
    exclude: Sequence[uuid.UUID],
) -> list[Neighbour]:
    """The user's K cards nearest by cosine distance, nearest first.

    Approximate first (HNSW, `iterative_scan` so the per-user filter still fills K); when
    that finds fewer than K — a user with few cards among many users' cards, where the
    index walk runs out (`hnsw.max_scan_tuples`) before it meets enough of theirs — the
    exact scan over the user's own cards (their index on `user_id`), which is cheap
    precisely then. `embedding` is a vector or a scalar subquery (`embedding_of`).
    """
    async with on_the_index(session):
        found = await _nearest(session, neighbours_query(user_id, embedding, k, exclude))
    if len(found) < k:
        found = await _nearest(
            session, neighbours_query(user_id, embedding, k, exclude, exact=True)
        )
    return found


@asynccontextmanager
async def on_the_index(session: AsyncSession) -> AsyncIterator[None]:
    """Statements run inside are planned with the approximate search's settings."""
    enable_sort = await session.scalar(_APPROXIMATE, {"ef_search": str(HNSW_EF_SEARCH)})
    try:
        yield
    finally:
        await session.execute(_RESET, {"enable_sort": enable_sort})


def neighbours_query(
    user_id: uuid.UUID,
    embedding: Any,
    k: int,
    exclude: Sequence[uuid.UUID],
    *,
    exact: bool = False,
) -> Select[uuid.UUID, uuid.UUID, str, str, float]:
    distance = KnowledgeCard.embedding.cosine_distance(embedding)
    # `+ 0` is not the indexed operator, so no index can order by it: the exact scan.
    order = (distance + 0) if exact else distance
    query = select(
        KnowledgeCard.id,
        KnowledgeCard.scrap_id,
        KnowledgeCard.title,
        KnowledgeCard.summary,
        distance.label("distance"),
    ).where(KnowledgeCard.user_id == user_id)
    if exclude:
        query = query.where(KnowledgeCard.id.not_in(exclude))
    # A missing query card gives NULL distances: no neighbours, not K arbitrary cards.
    query = query.where(distance.is_not(None))
    return query.order_by(order).limit(k)


async def _nearest(
    session: AsyncSession, query: Select[uuid.UUID, uuid.UUID, str, str, float]
) -> list[Neighbour]:
    result = await session.execute(query)
    # relaxed_order may return neighbours slightly out of order
    return sorted(
        (Neighbour(row[0], row[1], row[2], row[3], float(row[4])) for row in result),
        key=lambda n: n.distance,
    )
