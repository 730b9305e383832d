"""POST /recall-quizzes and GET /recall-quizzes/{generationId} (docs/reference/job-rules.md §3.4)
over the real API and PostgreSQL, no worker: what is registered, bad input, ownership."""

from __future__ import annotations

import uuid
from datetime import date, timedelta
from typing import Any

import httpx
import pytest

from san_common.models import AsyncJob, RecallQuizGeneration
from tests.api.support import Sessions, assert_problem
from tests.til.support import Footprint, add_card, at_noon, days_ago, footprint, make_user

DAY = date(2024, 3, 5)

BAD_BODIES: list[tuple[str, Any]] = [
    ("unknown-type", {"targetDate": DAY.isoformat(), "quizTypes": ["ESSAY"]}),
    ("one-unknown", {"targetDate": DAY.isoformat(), "quizTypes": ["OX", "ESSAY"]}),
    ("lowercase", {"targetDate": DAY.isoformat(), "quizTypes": ["ox"]}),
    ("empty-list", {"targetDate": DAY.isoformat(), "quizTypes": []}),
    ("duplicates", {"targetDate": DAY.isoformat(), "quizTypes": ["OX", "OX"]}),
    ("a-string", {"targetDate": DAY.isoformat(), "quizTypes": "OX"}),
    ("null-types", {"targetDate": DAY.isoformat(), "quizTypes": None}),
    ("no-types", {"targetDate": DAY.isoformat()}),
    ("bad-date", {"targetDate": "2024-03-5", "quizTypes": ["OX"]}),
    ("no-such-day", {"targetDate": "2023-02-29", "quizTypes": ["OX"]}),
    ("no-date", {"quizTypes": ["OX"]}),
    ("extra-field", {"targetDate": DAY.isoformat(), "quizTypes": ["OX"], "count": 3}),
]


@pytest.mark.parametrize(("case", "body"), BAD_BODIES, ids=[c for c, _ in BAD_BODIES])
async def test_bad_requests_are_400_and_write_nothing(
    api: httpx.AsyncClient, sessions: Sessions, case: str, body: Any
) -> None:
    user = await make_user(sessions)
    await add_card(sessions, user, at_noon(DAY))
    response = await api.post("/recall-quizzes", json=body, headers=user.headers)
    assert_problem(response, 400, "VALIDATION_ERROR")
    assert await footprint(sessions, user) == Footprint(0, 0, 0, 0, 0)


async def test_future_or_empty_days_are_refused_and_write_nothing(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user = await make_user(sessions)
    await add_card(sessions, user, at_noon(DAY))
    for day, status, code in (
        (date.today() + timedelta(days=3), 400, "DATE_IN_FUTURE"),
        (DAY - timedelta(days=1), 422, "NO_CARDS_FOR_DATE"),
    ):
        body = {"targetDate": day.isoformat(), "quizTypes": ["OX"]}
        response = await api.post("/recall-quizzes", json=body, headers=user.headers)
        assert_problem(response, status, code)
    assert await footprint(sessions, user) == Footprint(0, 0, 0, 0, 0)


async def test_a_generation_is_registered_and_readable_by_its_owner_only(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    day = days_ago(2)
    owner, other = await make_user(sessions), await make_user(sessions)
    await add_card(sessions, owner, at_noon(day))
    body = {"targetDate": day.isoformat(), "quizTypes": ["SHORT_ANSWER", "OX"]}
    response = await api.post("/recall-quizzes", json=body, headers=owner.headers)
    assert response.status_code == 202, response.text
    accepted = response.json()
    assert accepted["targetId"] == accepted["generationId"]
    async with sessions() as session:
        job = await session.get(AsyncJob, uuid.UUID(accepted["jobId"]))
        generation = await session.get(RecallQuizGeneration, uuid.UUID(accepted["generationId"]))
    assert job is not None and generation is not None
    assert (job.job_type, job.target_id) == ("RECALL_QUIZ_GENERATION", generation.id)
    assert generation.quiz_types == ["SHORT_ANSWER", "OX"]

    path = f"/recall-quizzes/{accepted['generationId']}"
    view = (await api.get(path, headers=owner.headers)).json()
    assert (view["status"], view["quizzes"], view["targetDate"]) == ("PENDING", [], str(day))
    assert view["quizTypes"] == ["SHORT_ANSWER", "OX"]
    assert_problem(await api.get(path, headers=other.headers), 404, "NOT_FOUND")
    unknown = f"/recall-quizzes/{uuid.uuid4()}"
    assert_problem(await api.get(unknown, headers=owner.headers), 404, "NOT_FOUND")
    bad_id = "/recall-quizzes/not-a-uuid"
    assert_problem(await api.get(bad_id, headers=owner.headers), 400, "VALIDATION_ERROR")
