"""POST /til and the TIL reads (docs/reference/job-rules.md §3.2) over the real API and PostgreSQL,
no worker: serialization of concurrent requests, atomicity of the caller's-transaction registration,
bad input, pagination, recall cards and ownership."""

from __future__ import annotations

import asyncio
import uuid
from datetime import date, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert

from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.registration import TransactionRequired, register_job_in_transaction
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.til import local_today, start_til_generation, zone_named
from tests.api.support import Sessions, api_with, assert_problem, embedding_at
from tests.conftest import api_settings
from tests.til.support import (
    Footprint,
    TestUser,
    add_card,
    add_summary,
    at_noon,
    days_ago,
    footprint,
    make_user,
)

JSON = {"content-type": "application/json"}
NOTHING = Footprint(summaries=0, generations=0, quizzes=0, jobs=0, outbox=0)


async def _user_with_cards(sessions: Sessions, day: date, zone: str = "UTC") -> TestUser:
    user = await make_user(sessions, zone)
    await add_card(sessions, user, at_noon(day, zone), title="Python GIL")
    return user


# -- serialization --------------------------------------------------------------------------


async def test_twenty_concurrent_requests_for_one_day_make_one_summary_and_one_job(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    day = days_ago(2)
    user = await _user_with_cards(sessions, day)
    responses = await asyncio.gather(
        *(
            api.post("/til", json={"targetDate": day.isoformat()}, headers=user.headers)
            for _ in range(20)
        )
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [202] + [409] * 19, [r.text for r in responses]
    for response in responses:
        if response.status_code == 409:
            assert_problem(response, 409, "DUPLICATE_RESOURCE")
    accepted = next(r.json() for r in responses if r.status_code == 202)
    assert accepted["targetId"] == accepted["summaryId"]

    assert await footprint(sessions, user) == Footprint(1, 0, 0, jobs=1, outbox=1)
    async with sessions() as session:
        job = await session.get(AsyncJob, uuid.UUID(accepted["jobId"]))
    assert job is not None
    assert (job.job_type, str(job.target_id)) == ("TIL_GENERATION", accepted["summaryId"])


async def test_concurrent_requests_for_different_days_still_allow_one_active_til_per_user(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    first, second = days_ago(2), days_ago(3)
    user = await _user_with_cards(sessions, first)
    await add_card(sessions, user, at_noon(second))
    responses = await asyncio.gather(
        *(
            api.post("/til", json={"targetDate": day.isoformat()}, headers=user.headers)
            for day in [first, second] * 5
        )
    )
    assert sorted(r.status_code for r in responses) == [202] + [409] * 9, [
        r.text for r in responses
    ]
    assert await footprint(sessions, user) == Footprint(1, 0, 0, jobs=1, outbox=1)


async def test_a_second_request_while_the_job_is_active_is_409_and_after_it_is_accepted(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    day = days_ago(2)
    user = await _user_with_cards(sessions, day)
    body = {"targetDate": day.isoformat()}
    accepted = (await api.post("/til", json=body, headers=user.headers)).json()
    conflict = assert_problem(
        await api.post("/til", json=body, headers=user.headers), 409, "DUPLICATE_RESOURCE"
    )
    assert conflict["activeJobId"] == accepted["jobId"]

    # The job ends (as a worker or the recovery sweep would leave it): the same day may be
    # generated again, reusing its summary row, which goes back to PENDING without its error.
    async with sessions() as session, session.begin():
        await session.execute(
            text("UPDATE async_jobs SET status = 'FAILED' WHERE job_id = :id"),
            {"id": accepted["jobId"]},
        )
        await session.execute(
            text(
                "UPDATE daily_summaries SET status = 'FAILED', error_message = 'x' WHERE id = :id"
            ),
            {"id": accepted["summaryId"]},
        )
    again = await api.post("/til", json=body, headers=user.headers)
    assert again.status_code == 202, again.text
    assert again.json()["summaryId"] == accepted["summaryId"]
    assert again.json()["jobId"] != accepted["jobId"]
    til = (await api.get(f"/til/{accepted['summaryId']}", headers=user.headers)).json()
    assert (til["status"], til["errorMessage"]) == ("PENDING", None)


# -- atomicity --------------------------------------------------------------------------------


async def test_failed_registration_leaves_no_summary_row(fresh_db_url: str, amqp_url: str) -> None:
    """A real unique violation on the active-job index during registration: the summary
    inserted earlier in the same transaction must roll back with it."""
    engine = create_engine(fresh_db_url, pool_size=2)
    sessions = create_session_factory(engine)
    try:
        day = days_ago(2)
        user = await _user_with_cards(sessions, day)
        # The next summary gets a known id, and another user's active TIL job already
        # targets that id: the insert succeeds, the registration then conflicts.
        doomed = uuid.uuid4()
        async with sessions() as session, session.begin():
            await session.execute(
                text(f"ALTER TABLE daily_summaries ALTER COLUMN id SET DEFAULT '{doomed}'::uuid")
            )
            await session.execute(
                insert(AsyncJob).values(
                    job_id=uuid.uuid4(),
                    job_type="TIL_GENERATION",
                    target_id=doomed,
                    user_id=uuid.uuid4(),
                )
            )
        async with api_with(api_settings(fresh_db_url, amqp_url)) as api:
            body = {"targetDate": day.isoformat()}
            response = await api.post("/til", json=body, headers=user.headers)
            problem = assert_problem(response, 409, "DUPLICATE_RESOURCE")
            assert str(doomed) in problem["detail"]
            assert await footprint(sessions, user) == NOTHING

            # Control: without the conflicting job the very same request goes through.
            async with sessions() as session, session.begin():
                await session.execute(
                    text("UPDATE async_jobs SET status = 'FAILED' WHERE target_id = :id"),
                    {"id": doomed},
                )
            response = await api.post("/til", json=body, headers=user.headers)
            assert response.status_code == 202, response.text
            assert response.json()["summaryId"] == str(doomed)
    finally:
        await engine.dispose()


async def test_registration_outside_a_transaction_raises_and_writes_nothing(
    sessions: Sessions,
) -> None:
    day = days_ago(2)
    user = await _user_with_cards(sessions, day)
    async with sessions() as session:
        assert not session.in_transaction()
        with pytest.raises(TransactionRequired):
            await register_job_in_transaction(
                session,
                job_type=JobType.TIL_GENERATION,
                target_id=uuid.uuid4(),
                user_id=user.user_id,
            )
        with pytest.raises(TransactionRequired):
            await start_til_generation(session, user_id=user.user_id, target_date=day)
        assert not session.in_transaction()
    assert await footprint(sessions, user) == NOTHING


# -- bad input ----------------------------------------------------------------------------------

BAD_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("no-zero-padding", {"json": {"targetDate": "2024-1-5"}}),
    ("slashes", {"json": {"targetDate": "2024/01/05"}}),
    ("no-such-day", {"json": {"targetDate": "2024-02-30"}}),
    ("a-word", {"json": {"targetDate": "yesterday"}}),
    ("a-datetime", {"json": {"targetDate": "2024-01-05T00:00:00Z"}}),
    ("a-timestamp", {"json": {"targetDate": 1704412800}}),
    ("null", {"json": {"targetDate": None}}),
    ("a-list", {"json": {"targetDate": ["2024-01-05"]}}),
    ("missing", {"json": {}}),
    ("extra-field", {"json": {"targetDate": "2024-01-05", "userId": "someone"}}),
    ("malformed-json", {"content": b'{"targetDate": "2024-01-05"', "headers": JSON}),
    ("body-array", {"json": ["2024-01-05"]}),
]


@pytest.mark.parametrize(("case", "request_kw"), BAD_BODIES, ids=[c for c, _ in BAD_BODIES])
async def test_malformed_requests_are_400_and_write_nothing(
    api: httpx.AsyncClient, sessions: Sessions, case: str, request_kw: dict[str, Any]
) -> None:
    user = await _user_with_cards(sessions, date(2024, 1, 5))
    headers = {**request_kw.pop("headers", {}), **user.headers}
    response = await api.post("/til", headers=headers, **request_kw)
    assert_problem(response, 400, "VALIDATION_ERROR")
    assert await footprint(sessions, user) == NOTHING


async def test_a_day_after_today_in_the_users_time_zone_is_400(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    # Kiritimati is UTC+14: its "today" is never behind any other zone's.
    user = await _user_with_cards(sessions, days_ago(2), zone="Pacific/Kiritimati")
    tomorrow = local_today(zone_named(user.zone)) + timedelta(days=1)
    for day in (tomorrow, date(9999, 12, 31)):
        response = await api.post(
            "/til", json={"targetDate": day.isoformat()}, headers=user.headers
        )
        assert_problem(response, 400, "DATE_IN_FUTURE")
    assert await footprint(sessions, user) == NOTHING


async def test_a_day_without_cards_is_422_and_the_day_follows_the_users_time_zone(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    # 23:30 in Seoul on day D is 14:30Z on D: a Seoul user's card belongs to D, not D+1.
    day = days_ago(3)
    user = await make_user(sessions, "Asia/Seoul")
    await add_card(sessions, user, at_noon(day, "Asia/Seoul").replace(hour=23, minute=30))
    for empty in (day + timedelta(days=1), day - timedelta(days=1), date(1, 1, 1)):
        response = await api.post(
            "/til", json={"targetDate": empty.isoformat()}, headers=user.headers
        )
        problem = assert_problem(response, 422, "NO_CARDS_FOR_DATE")
        assert "Asia/Seoul" in problem["detail"]
    assert await footprint(sessions, user) == NOTHING
    response = await api.post("/til", json={"targetDate": day.isoformat()}, headers=user.headers)
    assert response.status_code == 202, response.text


# -- reads --------------------------------------------------------------------------------------


async def test_tils_are_listed_newest_first_in_pages_and_by_date(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user, stranger = await make_user(sessions), await make_user(sessions)
    days = [days_ago(n) for n in (2, 3, 4, 5, 6)]
    ids = {day: await add_summary(sessions, user, day) for day in reversed(days)}
    await add_summary(sessions, stranger, days[0])

    seen: list[str] = []
    cursor: str | None = None
    for _ in range(3):
        params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = (await api.get("/til", params=params, headers=user.headers)).json()
        seen += [item["summaryId"] for item in page["items"]]
        cursor = page["nextCursor"]
    assert seen == [str(ids[day]) for day in days]
    assert cursor is None

    one = (await api.get("/til", params={"date": days[2].isoformat()}, headers=user.headers)).json()
    assert [item["summaryId"] for item in one["items"]] == [str(ids[days[2]])]
    assert one["items"][0]["tilMarkdown"] == f"# TIL {days[2]}\n"
    none = await api.get("/til", params={"date": days_ago(40).isoformat()}, headers=user.headers)
    assert none.json() == {"items": [], "nextCursor": None}


@pytest.mark.parametrize(
    "params",
    [
        {"date": "2024-13-01"},
        {"date": "today"},
        {"cursor": "garbage"},
        {"limit": "0"},
        {"limit": "101"},
    ],
)
async def test_bad_list_parameters_are_400(
    api: httpx.AsyncClient, sessions: Sessions, params: dict[str, str]
) -> None:
    user = await make_user(sessions)
    assert_problem(
        await api.get("/til", params=params, headers=user.headers), 400, "VALIDATION_ERROR"
    )


async def test_recall_cards_are_near_the_til_without_its_own_cards_else_the_k_nearest(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    """The TIL's embedding is e0; each card's cosine distance from it is crafted."""
    day = days_ago(2)
    user, stranger = await make_user(sessions), await make_user(sessions)

    async def card(distance: float, axis: int, owner: TestUser = user) -> str:
        created = at_noon(days_ago(10 + axis))
        return str(await add_card(sessions, owner, created, embedding=embedding_at(distance, axis)))

    source_a, source_b = await card(0.0, 1), await card(0.1, 2)
    near, middle, far = await card(0.3, 3), await card(0.45, 4), await card(0.8, 5)
    await card(0.0, 6, owner=stranger)
    e0 = embedding_at(0.0, 1)
    til = await add_summary(
        sessions, user, day, embedding=e0, sources=[uuid.UUID(source_a), uuid.UUID(source_b)]
    )
    body = (await api.get(f"/til/{til}/recall-cards", headers=user.headers)).json()
    assert (body["fallback"], body["threshold"]) == (False, 0.5)
    assert [c["cardId"] for c in body["cards"]] == [near, middle]
    assert [c["distance"] for c in body["cards"]] == pytest.approx([0.3, 0.45], abs=1e-4)

    detail = (await api.get(f"/til/{til}", headers=user.headers)).json()
    assert set(detail["sourceCardIds"]) == {source_a, source_b}

    # Every card within the threshold is a source of this TIL: the K nearest of the rest.
    all_near = [uuid.UUID(c) for c in (source_a, source_b, near, middle)]
    til_2 = await add_summary(sessions, user, days_ago(3), embedding=e0, sources=all_near)
    body = (await api.get(f"/til/{til_2}/recall-cards", headers=user.headers)).json()
    assert body["fallback"] is True
    assert [c["cardId"] for c in body["cards"]] == [far]

    # `limit` (the K of the fallback) bounds the within-threshold list too.
    limited = await api.get(f"/til/{til}/recall-cards", params={"limit": 1}, headers=user.headers)
    assert [c["cardId"] for c in limited.json()["cards"]] == [near]


async def test_recall_cards_of_a_til_not_generated_yet_is_400(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user = await make_user(sessions)
    pending = await add_summary(sessions, user, days_ago(2), status="PENDING")
    response = await api.get(f"/til/{pending}/recall-cards", headers=user.headers)
    assert_problem(response, 400, "TIL_NOT_COMPLETED")


async def test_another_users_til_is_404_everywhere(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    owner, other = await make_user(sessions), await make_user(sessions)
    day = days_ago(2)
    til = await add_summary(sessions, owner, day, embedding=embedding_at(0.0, 1))
    for path in (f"/til/{til}", f"/til/{til}/recall-cards", f"/til/{uuid.uuid4()}"):
        assert_problem(await api.get(path, headers=other.headers), 404, "NOT_FOUND")
    listed = await api.get("/til", params={"date": day.isoformat()}, headers=other.headers)
    assert listed.json()["items"] == []
    assert (await api.get(f"/til/{til}", headers=owner.headers)).status_code == 200
    assert_problem(await api.get("/til/not-a-uuid", headers=owner.headers), 400, "VALIDATION_ERROR")
