"""Everyone's AI spending for operators (`GET /admin/api/usage`, the console's AI usage
page): the figures are the ledger's rows summed per UTC day, job type and user, within the
window; users cannot see it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.models import AiUsage
from san_common.usage import AiCall, TryUsage, ledger
from tests.admin.support import insert_jobs, new_user, operator_headers, user_headers

Sessions = async_sessionmaker[AsyncSession]


def _call(call: str, tokens: int, cost: str) -> AiCall:
    prompt, embedding = (tokens, 0) if call == "chat" else (0, tokens)
    return AiCall(
        model="m", call=call, prompt_tokens=prompt, completion_tokens=0,  # type: ignore[arg-type]
        embedding_tokens=embedding, estimated=False, latency_ms=5, cost_usd=Decimal(cost),
    )  # fmt: skip


async def _spend(
    sessions: Sessions, user_id: uuid.UUID, job_type: str, calls: list[AiCall], days_ago: int
) -> uuid.UUID:
    """One job of `user_id` whose try made `calls`, recorded `days_ago` UTC days back."""
    [job_id] = await insert_jobs(sessions, user_id, status="COMPLETED", job_type=job_type)
    async with sessions() as session, session.begin():
        await ledger.insert(session, [TryUsage(job_id, 1, user_id, job_type, calls)])
        at = datetime.now(UTC) - timedelta(days=days_ago)
        await session.execute(update(AiUsage).where(AiUsage.job_id == job_id).values(at=at))
    return job_id


async def test_operators_see_the_ledger_per_day_job_type_and_user(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    alice, alice_ext = await new_user(sessions)
    bob, bob_ext = await new_user(sessions)
    spent = [  # (user, job type, calls, days ago)
        (alice, "CARD_ANALYSIS", [_call("chat", 120, "0.0012"), _call("embedding", 30, "1E-4")], 0),
        (alice, "TIL_GENERATION", [_call("chat", 400, "0.0040")], 0),
        (bob, "CARD_ANALYSIS", [_call("chat", 90, "0.0009")], 2),
        (bob, "CARD_ANALYSIS", [_call("chat", 5000, "0.5")], 40),  # outside the window
    ]  # fmt: skip
    for user_id, job_type, calls, days_ago in spent:
        await _spend(sessions, user_id, job_type, calls, days_ago)

    refused = await api.get("/admin/api/usage", headers=user_headers(alice_ext))
    assert refused.status_code == 403, refused.text
    assert (await api.get("/admin/api/usage")).status_code == 401
    response = await api.get("/admin/api/usage?days=30", headers=operator_headers())
    assert response.status_code == 200, response.text
    body = response.json()

    today = datetime.now(UTC).date()
    per: dict[str, dict[str, list[object]]] = {"day": {}, "jobType": {}, "user": {}}
    for user_id, job_type, calls, days_ago in spent:
        if days_ago >= 30:
            continue
        keys = {"day": str(today - timedelta(days=days_ago)), "jobType": job_type,
                "user": str(user_id)}  # fmt: skip
        for group, key in keys.items():
            tokens, cost, jobs = per[group].get(key, [0, Decimal(0), 0])
            per[group][key] = [
                tokens + sum(c.tokens for c in calls),  # type: ignore[operator]
                cost + sum(c.cost_usd for c in calls),  # type: ignore[operator]
                jobs + 1,  # type: ignore[operator]
            ]
    expected = {
        group: {key: [t, float(c), j] for key, (t, c, j) in rows.items()}  # type: ignore[arg-type]
        for group, rows in per.items()
    }

    def figures(rows: list[dict[str, object]], key: str) -> dict[str, list[object]]:
        return {str(r[key]): [r["tokens"], r["costUsd"], r["jobs"]] for r in rows}

    assert body["since"] == str(today - timedelta(days=29))
    assert figures(body["perDay"], "day") == expected["day"]
    assert figures(body["perJobType"], "jobType") == expected["jobType"]
    assert figures(body["perUser"], "userId") == expected["user"]
    assert {r["user"] for r in body["perUser"]} == {alice_ext, bob_ext}
    # most expensive first
    assert [r["jobType"] for r in body["perJobType"]] == ["TIL_GENERATION", "CARD_ANALYSIS"]

    # a wider window takes in the old job; a window out of range is a 400, not a 500
    wide = (await api.get("/admin/api/usage?days=60", headers=operator_headers())).json()
    assert sum(r["tokens"] for r in wide["perUser"]) == sum(
        c.tokens for _, _, calls, _ in spent for c in calls
    )
    for bad in ("0", "367", "x"):
        answer = await api.get(f"/admin/api/usage?days={bad}", headers=operator_headers())
        assert answer.status_code == 400, (bad, answer.text)


async def test_the_console_page_shows_the_figures(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    await _spend(sessions, user_id, "RECALL_QUIZ_GENERATION", [_call("chat", 777, "0.0123")], 0)
    token = operator_headers()["Authorization"].removeprefix("Bearer ")
    page = await api.get("/admin/usage", headers={"Cookie": f"san_admin={token}"})
    assert page.status_code == 200, page.text
    for figure in (
        "RECALL_QUIZ_GENERATION",
        external,
        ">777<",
        ">0.0123<",
        str(datetime.now(UTC).date()),
    ):
        assert figure in page.text, figure
    user_cookie = user_headers(external)["Authorization"].removeprefix("Bearer ")
    denied = await api.get(
        "/admin/usage", headers={"Cookie": f"san_admin={user_cookie}"}, follow_redirects=False
    )
    assert denied.status_code != 200 and external not in denied.text
