"""Per-user budgets (issue 39, acceptance 2): a user whose next job would pass the budget
is refused at enqueue with BUDGET_EXCEEDED and the reset time, no AI call is made, and
another user is unaffected; a job that finds its user over budget when a worker takes it
waits for the reset or fails, per BUDGET_AT_RUN, without calling the AI."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Literal

import httpx
import pytest
from sqlalchemy import select

from san_api.app import create_app
from san_api.auth.tokens import mint
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, AsyncJobTry, Scrap, User
from san_common.usage import AiCall, TryUsage, budgets, ledger
from san_common.usage.budgets import Limits
from tests.api.support import assert_problem
from tests.conftest import JWT_SECRET, api_settings
from tests.fakes.fake_ai import FakeAiServer
from tests.usage.conftest import System, start_system
from tests.waiting import eventually, settled_job_via_api

pytestmark = pytest.mark.rabbit

BUDGET = 1000


@pytest.fixture
async def budgeted(
    fresh_db_url: str, amqp_url: str, topology: object, fake_ai: FakeAiServer
) -> AsyncIterator[System]:
    async for running in start_system(
        fresh_db_url,
        amqp_url,
        topology,
        fake_ai,
        budget=Limits(BUDGET, Decimal(0)),  # type: ignore[arg-type]
    ):
        yield running


def next_utc_midnight() -> datetime:
    now = datetime.now(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)


async def test_the_scrap_that_would_cross_the_budget_is_refused_at_enqueue(
    budgeted: System,
) -> None:
    system = budgeted
    alice, bob = (
        system.headers(f"alice-{uuid.uuid4().hex}"),
        system.headers(f"bob-{uuid.uuid4().hex}"),
    )
    spent_per_scrap = 0
    refused = None
    for i in range(20):
        response = await system.api.post(
            "/scraps", json={"content": f"budget note {i} {uuid.uuid4().hex}"}, headers=alice
        )
        if response.status_code != 202:
            refused = response
            break
        body = response.json()
        for key in ("analysisJobId", "refineJobId"):
            job = await settled_job_via_api(system.api, alice, body[key])
            assert job["status"] == "COMPLETED", job
        if not spent_per_scrap:
            first = await system.ledger()
            spent_per_scrap = first["prompt"] + first["completion"] + first["embedding"]
    assert refused is not None, "never refused"
    # The test is only meaningful when a scrap costs well under the budget.
    assert 0 < spent_per_scrap < BUDGET / 2, spent_per_scrap

    problem = assert_problem(refused, 429, "BUDGET_EXCEEDED")
    assert datetime.fromisoformat(problem["resetsAt"]) == next_utc_midnight()
    assert 0 < int(refused.headers["Retry-After"]) <= 86_400 + 1
    # Never crossed: the refusal came before the scrap that would have.
    spent = await system.ledger()
    assert spent["prompt"] + spent["completion"] + spent["embedding"] <= BUDGET
    calls = len(system.ai.requests)
    again = await system.api.post("/scraps", json={"content": "one more"}, headers=alice)
    assert_problem(again, 429, "BUDGET_EXCEEDED")
    async with system.sessions() as session:
        scraps = await session.scalar(select(Scrap.id).where(Scrap.content == "one more"))
    assert scraps is None  # nothing registered
    # Bob has a budget of his own.
    ok = await system.api.post("/scraps", json={"content": f"bob {uuid.uuid4().hex}"}, headers=bob)
    assert ok.status_code == 202, ok.text
    assert (await settled_job_via_api(system.api, bob, ok.json()["analysisJobId"]))[
        "status"
    ] == "COMPLETED"
    assert len(system.ai.requests) > calls  # Bob's calls only
    # An operator raises Alice's budget: she may go on.
    async with system.sessions() as session, session.begin():
        alice_id = await session.scalar(select(User.id).where(User.external_id.like("alice-%")))
        assert alice_id is not None
        await budgets.set_override(
            session, alice_id, tokens_per_day=100_000, usd_per_month=None, actor="test"
        )
    raised = await system.api.post("/scraps", json={"content": "after the raise"}, headers=alice)
    assert raised.status_code == 202, raised.text


async def run_over_budget(system: System) -> AsyncJob:
    """A job registered for a user whose budget an operator then lowered below what they
    spent (so the enqueue check let it through): what the worker does with it."""
    async with system.sessions() as session, session.begin():
        user = User(external_id=f"run-{uuid.uuid4().hex}")
        session.add(user)
        await session.flush()
        scrap = Scrap(user_id=user.id, content="over budget", content_hash=uuid.uuid4().hex)
        session.add(scrap)
        await session.flush()
        await budgets.set_override(
            session, user.id, tokens_per_day=1, usd_per_month=None, actor="test"
        )
    # What the user spent today: one earlier call.
    async with system.sessions() as session, session.begin():
        await ledger.insert(
            session,
            [
                TryUsage(
                    uuid.uuid4(),
                    1,
                    user.id,
                    "CARD_ANALYSIS",
                    [AiCall("gpt-4o-mini", "chat", 5, 5, 0, False, 1, Decimal(0))],
                )
            ],
        )
    calls = len(system.ai.requests)
    job = await register_job(
        system.sessions, job_type=JobType.CARD_ANALYSIS, target_id=scrap.id, user_id=user.id
    )
    found: AsyncJob | None = None

    async def tried() -> bool:
        nonlocal found
        async with system.sessions() as session:
            # The try first: the job read after it sees the status its closing set.
            closed = await session.scalar(
                select(AsyncJobTry.outcome).where(
                    AsyncJobTry.job_id == job.job_id, AsyncJobTry.outcome.is_not(None)
                )
            )
            found = await session.get(AsyncJob, job.job_id)
        return closed is not None

    await eventually(tried, what="the worker to try the job")
    assert len(system.ai.requests) == calls  # never half-runs: no call at all
    assert found is not None
    return found


@pytest.mark.parametrize("at_run", ["wait", "fail"])
async def test_a_job_over_budget_at_run_time_waits_or_fails_without_calling_the_ai(
    fresh_db_url: str,
    amqp_url: str,
    topology: object,
    fake_ai: FakeAiServer,
    at_run: Literal["wait", "fail"],
) -> None:
    async for system in start_system(
        fresh_db_url,
        amqp_url,
        topology,
        fake_ai,
        at_run=at_run,  # type: ignore[arg-type]
    ):
        job = await run_over_budget(system)
        if at_run == "wait":
            assert job.status == "PENDING"
            assert job.next_attempt_at is not None
            assert abs((job.next_attempt_at - next_utc_midnight()).total_seconds()) < 5
            assert "BUDGET_EXCEEDED" in (job.last_error or "")
        else:
            assert job.status == "FAILED"
            assert "BUDGET_EXCEEDED" in (job.error_message or "")


@pytest.mark.parametrize("rate_limits", [True, False], ids=["limits-on", "limits-off"])
async def test_an_operators_override_decides_at_enqueue_with_or_without_the_rate_limits(
    db_url: str, amqp_url: str, rate_limits: bool
) -> None:
    """The override is read with the active-job count when the limits are on, on its own
    when they are off: either way a column left NULL keeps the (here unlimited) default,
    and a limit already spent refuses the scrap before anything is saved."""
    subject = f"override-{uuid.uuid4().hex}"
    headers = {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"}
    app = create_app(api_settings(db_url, amqp_url, rate_limit_enabled=rate_limits))
    engine = create_engine(db_url)
    sessions = create_session_factory(engine)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as api,
        ):
            first = await api.post("/scraps", json={"content": "before"}, headers=headers)
            assert first.status_code == 202, first.text
            async with sessions() as session, session.begin():
                user_id = await session.scalar(select(User.id).where(User.external_id == subject))
                assert user_id is not None
                await budgets.set_override(
                    session, user_id, tokens_per_day=None, usd_per_month=None, actor="test"
                )
                await ledger.insert(session, [_spent(user_id, tokens=10)])
            kept = await api.post("/scraps", json={"content": "defaults"}, headers=headers)
            assert kept.status_code == 202, kept.text

            async with sessions() as session, session.begin():
                await budgets.set_override(
                    session, user_id, tokens_per_day=10, usd_per_month=None, actor="test"
                )
            refused = await api.post("/scraps", json={"content": "over"}, headers=headers)
            problem = assert_problem(refused, 429, "BUDGET_EXCEEDED")
            assert "10 of 10 tokens" in problem["detail"]
            async with sessions() as session:
                saved = await session.scalar(select(Scrap.id).where(Scrap.content == "over"))
            assert saved is None
    finally:
        await engine.dispose()


def _spent(user_id: uuid.UUID, *, tokens: int) -> TryUsage:
    """One try's call of `tokens` prompt tokens, made now."""
    call = AiCall("gpt-4o-mini", "chat", tokens, 0, 0, False, 1, Decimal(0))
    return TryUsage(uuid.uuid4(), 1, user_id, "CARD_ANALYSIS", [call])
