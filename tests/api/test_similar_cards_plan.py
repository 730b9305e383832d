"""The similar-cards search walks the HNSW index (migration 0006's `nearest_cards`, with
its own planner settings): left to itself, the planner prefers the exact scan even at
100k cards of one user (it does not count the TOASTed embeddings it would read), and at a
handful of cards it always does — so a handful is enough to tell the settings apart.
The function's plan is not visible to EXPLAIN from outside; the index's scan counter of
the current transaction (`pg_stat_get_xact_numscans`) is. `make bench` measures the real
thing at 100k cards (latency, recall, index scans per request)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from san_api.cards import repository
from tests.api.support import (
    Sessions,
    embedding_at,
    insert_card,
    save_scrap,
    subject_of,
    user_id_of,
)

_SCANS = text("SELECT pg_stat_get_xact_numscans(to_regclass('ix_knowledge_cards_embedding_hnsw'))")


async def _hnsw_scans(
    session: AsyncSession, user_id: uuid.UUID, query: object, *, exact: bool
) -> tuple[int, list[repository.Neighbour]]:
    before = await session.scalar(_SCANS)
    found = await repository.nearest(session, user_id, query, 3, [], exact=exact)
    return await session.scalar(_SCANS) - before, found


async def test_the_approximate_search_walks_the_hnsw_index_and_the_exact_one_does_not(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    await save_scrap(api, headers)
    user_id = await user_id_of(sessions, subject_of(headers))
    card = await insert_card(sessions, user_id, embedding_at(0.0, 1))
    for i in range(3):
        await insert_card(sessions, user_id, embedding_at(0.1 * (i + 1), 2 + i))

    async with sessions() as session, session.begin():
        of_card = repository.CardEmbedding(card.card_id)
        scans, approximate = await _hnsw_scans(session, user_id, of_card, exact=False)
        assert scans >= 1, "the approximate search did not walk the HNSW index"
        # the function's settings end with it: the rest of the transaction plans as usual
        assert await session.scalar(text("SHOW enable_sort")) == "on"
        assert await session.scalar(text("SHOW hnsw.ef_search")) == "40"

        scans, exact = await _hnsw_scans(session, user_id, of_card, exact=True)
        assert scans == 0, "the exact scan went through the HNSW index"
        # a query vector from Python (a TIL's recall cards) takes the same paths
        vector = embedding_at(0.0, 1)
        scans, from_vector = await _hnsw_scans(session, user_id, vector, exact=False)
        assert scans >= 1
    assert [n.card_id for n in approximate] == [n.card_id for n in exact]
    assert [n.card_id for n in from_vector] == [n.card_id for n in exact]
    assert approximate[0].card_id == card.card_id and approximate[0].distance < 1e-6
