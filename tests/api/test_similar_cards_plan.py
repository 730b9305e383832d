"""The similar-cards query is planned on the HNSW index (san_api/cards/repository.py):
left to itself, the planner prefers the exact scan even at 100k cards of one user (it
does not count the TOASTed embeddings it would read). Checked with EXPLAIN on a handful
of cards — the settings, not the table size, decide the plan; `make bench` measures the
real thing at 100k cards (latency, recall, index scans per request)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
from sqlalchemy import text

from san_api.cards import repository
from tests.api.support import (
    Sessions,
    embedding_at,
    insert_card,
    save_scrap,
    subject_of,
    user_id_of,
)

HNSW = "ix_knowledge_cards_embedding_hnsw"


async def _plan(sessions: Sessions, user_id: uuid.UUID, card_id: uuid.UUID, exact: bool) -> str:
    query = repository.neighbours_query(
        user_id, repository.embedding_of(card_id, user_id), 10, [card_id], exact=exact
    )
    async with sessions() as session, session.begin():
        connection = await session.connection()
        compiled = query.compile(
            dialect=connection.dialect, compile_kwargs={"render_postcompile": True}
        )
        params = tuple(compiled.params[name] for name in compiled.positiontup or ())
        async with repository.on_the_index(session):
            rows = await connection.exec_driver_sql(f"EXPLAIN {compiled}", params)
            plan = "\n".join(row[0] for row in rows)
        # and the settings are back to normal for the rest of the transaction
        assert await session.scalar(text("SHOW enable_sort")) == "on"
    return plan


async def test_the_approximate_query_walks_the_hnsw_index_and_the_fallback_does_not(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    await save_scrap(api, headers)
    user_id = await user_id_of(sessions, subject_of(headers))
    card = await insert_card(sessions, user_id, embedding_at(0.0, 1))
    for i in range(3):
        await insert_card(sessions, user_id, embedding_at(0.1 * (i + 1), 2 + i))

    approximate = await _plan(sessions, user_id, card.card_id, exact=False)
    assert f"Index Scan using {HNSW}" in approximate, approximate
    assert "Sort" not in approximate, approximate

    exact = await _plan(sessions, user_id, card.card_id, exact=True)
    assert HNSW not in exact, exact
