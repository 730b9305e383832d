"""What holds jobs back, for operators (`GET /admin/api/scheduling`, the console's
Scheduling page): each upstream budget as the workers would find it, with the jobs waiting
for its reset, and each user's share of each job type's active jobs; users cannot see it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.db.engine import bound_engine
from san_common.jobs import lifecycle
from san_common.jobs.lifecycle import TryOutcome
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import User
from san_common.quotas import QuotaWait, Static, UpstreamQuotas
from tests.admin.support import insert_jobs, new_user, operator_headers, user_headers

Sessions = async_sessionmaker[AsyncSession]
KEY = "ai http://ai.example/v1 chat-model"
WINDOW = 3.0  # seconds: the window test looks at a budget within one, then after it


async def _spent_quota(sessions: Sessions) -> QuotaWait:
    """Two calls reserved (in flight) of a budget of two a minute; the third is refused."""
    quotas = UpstreamQuotas(bound_engine(sessions))
    for _ in range(2):
        await quotas.reserve(KEY, 10, Static(requests=2))
    with pytest.raises(QuotaWait) as refused:
        await quotas.reserve(KEY, 10, Static(requests=2))
    return refused.value


async def _waits_for(sessions: Sessions, job_id: uuid.UUID, refused: QuotaWait) -> None:
    """A worker claims the job and meets the spent quota (what the executor does)."""
    async with sessions() as session, session.begin():
        connection = await session.connection()
        got = await lifecycle.claim_batch(connection, [job_id], "w", timedelta(seconds=30))
        assert isinstance(got[job_id], lifecycle.Claimed)
        await lifecycle.retry_later(
            session,
            job_id,
            1,
            delay=timedelta(seconds=refused.retry_after or 0),
            error=str(refused),
            summary="waiting",
            outcome=TryOutcome.RATE_LIMITED,
            waiting_for=refused.waiting_for,
            waiting_key=refused.key,
        )


async def test_operators_see_each_budget_and_each_users_share(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    alice, alice_ext = await new_user(sessions)
    bob, bob_ext = await new_user(sessions)
    await insert_jobs(sessions, alice, 2, status="PROCESSING")
    await insert_jobs(sessions, alice, 1, status="PENDING")
    await insert_jobs(sessions, bob, 1, status="PROCESSING")
    [waiting, _] = await insert_jobs(sessions, bob, 2, status="PENDING")
    await insert_jobs(sessions, bob, 1, status="PENDING", job_type="TIL_GENERATION")
    await insert_jobs(sessions, bob, 3, status="COMPLETED")  # not active: not counted
    # registered as the API does: its message due in the outbox until the relay admits it
    await register_job(sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=bob)
    async with sessions() as session, session.begin():
        await session.execute(update(User).where(User.id == alice).values(share_weight=2))
    refused = await _spent_quota(sessions)
    await _waits_for(sessions, waiting, refused)

    assert (await api.get("/admin/api/scheduling")).status_code == 401
    denied = await api.get("/admin/api/scheduling", headers=user_headers(alice_ext))
    assert denied.status_code == 403, denied.text
    response = await api.get("/admin/api/scheduling", headers=operator_headers())
    assert response.status_code == 200, response.text
    view = response.json()

    [budget] = view["budgets"]
    assert budget["key"] == KEY
    assert (budget["requestsRemaining"], budget["requestsLimit"]) == (0, 2)
    assert (budget["inFlight"], budget["refused"], budget["jobsWaiting"]) == (2, 1, 1)
    reset = datetime.fromisoformat(budget["requestsResetAt"])
    assert datetime.now(UTC) < reset <= datetime.now(UTC) + timedelta(seconds=61)

    shares = {(s["jobType"], s["user"]): s for s in view["shares"]}
    assert set(shares) == {
        ("CARD_ANALYSIS", alice_ext),
        ("CARD_ANALYSIS", bob_ext),
        ("SCRAP_REFINE", bob_ext),
        ("TIL_GENERATION", bob_ext),
    }
    figures = {
        k: (s["weight"], s["running"], s["pending"], s["waiting"], s["awaitingAdmission"])
        for k, s in shares.items()
    }
    # (the jobs inserted as PENDING have no message; the waiting one's is due at the reset)
    assert figures == {
        ("CARD_ANALYSIS", alice_ext): (2, 2, 1, 0, 0),
        ("CARD_ANALYSIS", bob_ext): (1, 1, 2, 1, 0),
        ("SCRAP_REFINE", bob_ext): (1, 0, 1, 0, 1),
        ("TIL_GENERATION", bob_ext): (1, 0, 1, 0, 0),
    }
    assert shares[("CARD_ANALYSIS", alice_ext)]["share"] == pytest.approx(2 / 3)
    assert shares[("CARD_ANALYSIS", bob_ext)]["share"] == pytest.approx(1 / 3)
    assert shares[("TIL_GENERATION", bob_ext)]["share"] == 0
    # the busiest user of a type first
    assert [s["user"] for s in view["shares"][:2]] == [alice_ext, bob_ext]
    assert view["sharesTruncated"] is False

    first = (await api.get("/admin/api/scheduling?limit=1", headers=operator_headers())).json()
    assert len(first["shares"]) == 1 and first["sharesTruncated"] is True
    for bad in ("0", "1001", "x"):
        answer = await api.get(f"/admin/api/scheduling?limit={bad}", headers=operator_headers())
        assert answer.status_code == 400, (bad, answer.text)


async def test_a_window_that_ended_shows_its_whole_limit_and_no_wait(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    quotas = UpstreamQuotas(bound_engine(sessions), window_seconds=WINDOW)
    await quotas.reserve(KEY, 0, Static(requests=1))
    [spent] = (await api.get("/admin/api/scheduling", headers=operator_headers())).json()["budgets"]
    assert (spent["requestsRemaining"], spent["inFlight"]) == (0, 1)
    await _window_ends()
    [budget] = (await api.get("/admin/api/scheduling", headers=operator_headers())).json()[
        "budgets"
    ]
    assert (budget["requestsRemaining"], budget["requestsResetAt"], budget["inFlight"]) == (
        1,
        None,
        0,
    )


async def _window_ends() -> None:
    import asyncio

    await asyncio.sleep(WINDOW + 0.2)  # the window's end is what is under test


async def test_the_console_page_shows_budgets_and_shares(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    await insert_jobs(sessions, user_id, 3, status="PROCESSING", job_type="SCRAP_REFINE")
    await _spent_quota(sessions)
    token = operator_headers()["Authorization"].removeprefix("Bearer ")
    page = await api.get("/admin/scheduling", headers={"Cookie": f"san_admin={token}"})
    assert page.status_code == 200, page.text
    for figure in (KEY, "0 / 2", "SCRAP_REFINE", external, ">3<", ">100%<"):
        assert figure in page.text, figure
    user_cookie = user_headers(external)["Authorization"].removeprefix("Bearer ")
    denied = await api.get(
        "/admin/scheduling", headers={"Cookie": f"san_admin={user_cookie}"}, follow_redirects=False
    )
    assert denied.status_code != 200 and KEY not in denied.text
