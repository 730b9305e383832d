"""End to end: API, relay and ai-worker as separate OS processes over real PostgreSQL and
RabbitMQ, with the offline `local` AI provider: scraps → cards → TIL → recall cards and
recall quizzes."""

from __future__ import annotations

import uuid
from datetime import date
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from san_common.db.engine import create_engine, create_session_factory
from san_common.models import KnowledgeCard
from tests.e2e.conftest import Stack
from tests.til.support import at_noon, days_ago
from tests.waiting import settled_job_via_api

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]

PYTHON_GIL = (
    "The global interpreter lock in CPython lets one thread run Python bytecode at a time. "
    "Threads help with waiting on input and output, not with CPU-bound Python code."
)
PYTHON_GIL_2 = (
    "CPython's global interpreter lock allows one thread at a time to run Python bytecode, "
    "so threads help with input and output waiting but not CPU-bound Python code."
)
SOURDOUGH = (
    "Sourdough bread rises with wild yeast and lactic acid bacteria from a starter of flour "
    "and water, fed daily and kept at room temperature."
)


async def _completed(
    client: httpx.AsyncClient, stack: Stack, headers: dict[str, str], job_id: str
) -> None:
    job = await settled_job_via_api(client, headers, job_id, context=stack.logs)
    assert job["status"] == "COMPLETED", (job, stack.logs())


async def _move_cards(db_url: str, days: dict[str, date]) -> None:
    """Give each card the creation time of its day (the flow made them all today)."""
    engine = create_engine(db_url, pool_size=1)
    try:
        async with create_session_factory(engine)() as session, session.begin():
            for card_id, day in days.items():
                await session.execute(
                    update(KnowledgeCard)
                    .where(KnowledgeCard.id == uuid.UUID(card_id))
                    .values(created_at=at_noon(day))
                )
    finally:
        await engine.dispose()


async def test_scraps_to_til_recall_cards_and_quizzes(stack: Stack, fresh_db_url: str) -> None:
    stack.start("relay")
    stack.start("ai-worker")
    headers = stack.headers("e2e-til-alice")
    gil_day, near_day, bread_day = days_ago(4), days_ago(3), days_ago(2)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as client:
        cards = []
        for content in (PYTHON_GIL, PYTHON_GIL_2, SOURDOUGH):
            response = await client.post("/scraps", json={"content": content}, headers=headers)
            assert response.status_code == 202, response.text
            scrap = response.json()
            await _completed(client, stack, headers, scrap["analysisJobId"])
            cards.append((await client.get(f"/cards/{scrap['scrapId']}", headers=headers)).json())
        gil, gil_2, bread = cards
        await _move_cards(
            fresh_db_url,
            {gil["cardId"]: gil_day, gil_2["cardId"]: near_day, bread["cardId"]: bread_day},
        )

        async def til_of(day: date) -> dict[str, Any]:
            body = {"targetDate": day.isoformat()}
            accepted = await client.post("/til", json=body, headers=headers)
            assert accepted.status_code == 202, accepted.text
            await _completed(client, stack, headers, accepted.json()["jobId"])
            page = await client.get("/til", params={"date": day.isoformat()}, headers=headers)
            (til,) = page.json()["items"]
            assert til["summaryId"] == accepted.json()["summaryId"]
            return til  # type: ignore[no-any-return]

        til = await til_of(gil_day)
        assert til["status"] == "COMPLETED"
        assert gil["title"] in til["tilMarkdown"]
        assert gil_2["title"] not in til["tilMarkdown"]  # another day's card
        assert til["sourceCardIds"] == [gil["cardId"]]
        recall = (await client.get(f"/til/{til['summaryId']}/recall-cards", headers=headers)).json()
        # The near duplicate from another day is within 0.5; its own card is excluded and
        # the bread is far away.
        assert recall["fallback"] is False
        assert [c["cardId"] for c in recall["cards"]] == [gil_2["cardId"]], recall

        bread_til = await til_of(bread_day)
        assert bread["title"] in bread_til["tilMarkdown"]
        path = f"/til/{bread_til['summaryId']}/recall-cards"
        recall = (await client.get(path, headers=headers)).json()
        assert recall["fallback"] is True  # nothing within 0.5: the K nearest instead
        assert {c["cardId"] for c in recall["cards"]} == {gil["cardId"], gil_2["cardId"]}
        assert all(c["distance"] > 0.5 for c in recall["cards"])

        listed = (await client.get("/til", headers=headers)).json()
        assert [t["summaryId"] for t in listed["items"]] == [
            bread_til["summaryId"],
            til["summaryId"],
        ]

        body = {"targetDate": gil_day.isoformat(), "quizTypes": ["OX", "SHORT_ANSWER"]}
        accepted = await client.post("/recall-quizzes", json=body, headers=headers)
        assert accepted.status_code == 202, accepted.text
        await _completed(client, stack, headers, accepted.json()["jobId"])
        quizzes_path = f"/recall-quizzes/{accepted.json()['generationId']}"
        generation = (await client.get(quizzes_path, headers=headers)).json()
        assert generation["status"] == "COMPLETED"
        assert {q["type"] for q in generation["quizzes"]} == {"OX", "SHORT_ANSWER"}

        other = stack.headers("e2e-til-bob")
        for path in (f"/til/{til['summaryId']}", quizzes_path):
            assert (await client.get(path, headers=other)).status_code == 404
