from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import Row, TextClause, bindparam, select, text
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


@dataclass(frozen=True)
class CardEmbedding:
    """The query vector of the user's card `card_id`, read where the search runs: no 1536
    floats parsed into Python and sent back."""

    card_id: uuid.UUID


@dataclass(frozen=True)
class Neighbour:
    card_id: uuid.UUID
    scrap_id: uuid.UUID
    title: str
    summary: str
    distance: float


def _search(function: str, query: str) -> TextClause:
    """One call of a search function of migration 0006 (`nearest_cards` walks the HNSW
    index under its own planner settings; `nearest_cards_exact` scans the user's cards)."""
    return text(
        f"SELECT id, scrap_id, title, summary, distance FROM {function}(:owner, {query}, :k,"
        " :excluded)"
    )


_OF_CARD = "(SELECT embedding FROM knowledge_cards WHERE id = :card_id AND user_id = :owner)"
_VECTOR = bindparam("query", type_=Vector())
# (exact, query is a card's embedding) → the statement, built once.
_SEARCHES = {
    (False, True): _search("nearest_cards", _OF_CARD),
    (True, True): _search("nearest_cards_exact", _OF_CARD),
    (False, False): _search("nearest_cards", ":query").bindparams(_VECTOR),
    (True, False): _search("nearest_cards_exact", ":query").bindparams(_VECTOR),
}


async def nearest(
    session: AsyncSession,
    user_id: uuid.UUID,
    query: CardEmbedding | Any,
    k: int,
    exclude: Sequence[uuid.UUID],
    *,
    exact: bool = False,
) -> list[Neighbour]:
    """The user's K cards nearest to `query` (a vector, or `CardEmbedding`) by cosine
    distance, nearest first.

    Approximate first (HNSW, `iterative_scan` so the per-user filter still fills K); when
    that finds fewer than K — a user with few cards among many users' cards, where the
    index walk runs out (`hnsw.max_scan_tuples`) before it meets enough of theirs — the
    exact scan over the user's own cards (their index on `user_id`), which is cheap
    precisely then. `exact=True` asks for the exact scan alone.
    """
    found = [] if exact else await _nearest(session, user_id, query, k, exclude, exact=False)
    if len(found) < k:
        found = await _nearest(session, user_id, query, k, exclude, exact=True)
    return found


async def _nearest(
    session: AsyncSession,
    user_id: uuid.UUID,
    query: CardEmbedding | Any,
    k: int,
    exclude: Sequence[uuid.UUID],
    *,
    exact: bool,
) -> list[Neighbour]:
    params: dict[str, Any] = {"owner": user_id, "k": k, "excluded": list(exclude)}
    if of_card := isinstance(query, CardEmbedding):
        params["card_id"] = query.card_id
    else:
        params["query"] = query
    result = await session.execute(_SEARCHES[exact, of_card], params)
    # relaxed_order may return neighbours slightly out of order
    return sorted(
        (Neighbour(row[0], row[1], row[2], row[3], float(row[4])) for row in result),
        key=lambda n: n.distance,
    )
