"""Issue 38, builds 4 and 5: a job the upstream quota holds back says so. The fake AI allows
one call a window; with the window spent, the next jobs wait PENDING for its reset, and
`GET /async-jobs/{id}` shows `waitingFor: "upstream-quota"` with `availableAt` at the
quota's reset, while the scaling signal leaves them out. After the reset they run, spending
no try, and say nothing more."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.app import create_app
from san_common.broker.depths import QueueDepths
from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, UpstreamQuota, User
from san_recovery.runnable import RunnableGauge
from tests.conftest import api_settings
from tests.faults.harness import FaultStack, seed, statuses, try_rows
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(300)]

WINDOW = 20.0  # long enough to look at the waiting jobs, short enough to see them run


@pytest.fixture
async def api(fresh_db_url: str, amqp_url: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(api_settings(fresh_db_url, amqp_url))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield client


async def owner_headers(
    db: async_sessionmaker[AsyncSession], job_id: uuid.UUID, token: Callable[[str], str]
) -> dict[str, str]:
    async with db() as session:
        external_id = await session.scalar(
            select(User.external_id).join(AsyncJob, AsyncJob.user_id == User.id)
            .where(AsyncJob.job_id == job_id)
        )  # fmt: skip
    assert external_id is not None
    return {"Authorization": f"Bearer {token(external_id)}"}


async def test_a_job_waiting_for_the_quota_says_so_and_is_not_runnable(
    stack: FaultStack,
    db: async_sessionmaker[AsyncSession],
    api: httpx.AsyncClient,
    token: Callable[[str], str],
    amqp_url: str,
) -> None:
    stack.ai.enforce_limits(requests=1, tokens=1_000_000, window=WINDOW)
    stack.start("relay")
    stack.start("ai-worker", UPSTREAM_QUOTAS="true")
    # The first job's answer tells the quota it is spent until the window's end.
    first = await seed(db, 1, [JobType.SCRAP_REFINE], label="waits")
    await eventually(
        lambda: _all(db, first.job_ids, "COMPLETED"),
        within=60,
        what="the first job completed",
        context=lambda: stack.logs(tail=3000),
    )
    waiting = await seed(db, 2, [JobType.SCRAP_REFINE], label="waits")

    async def both_waiting() -> bool:
        async with db() as session:
            rows = (
                await session.scalars(select(AsyncJob).where(AsyncJob.job_id.in_(waiting.job_ids)))
            ).all()
        return all(r.status == "PENDING" and r.waiting_for is not None for r in rows)

    await eventually(
        both_waiting, within=30, what="both jobs waiting", context=lambda: stack.logs(tail=3000)
    )
    async with db() as session:
        [quota] = (await session.scalars(select(UpstreamQuota))).all()
    assert quota.requests_reset_at is not None
    for job_id in waiting.job_ids:
        answer = await api.get(
            f"/async-jobs/{job_id}", headers=await owner_headers(db, job_id, token)
        )
        assert answer.status_code == 200, answer.text
        view = answer.json()
        assert view["status"] == "PENDING"
        assert view["waitingFor"] == "upstream-quota"
        available_at = datetime.fromisoformat(view["availableAt"])
        # due at the reset: the refusal's wait, counted from a moment later
        assert quota.requests_reset_at <= available_at
        assert available_at - quota.requests_reset_at < timedelta(seconds=1)

    depths = QueueDepths(amqp_url)
    try:
        measured = await RunnableGauge(db, depths, Topology(stack.prefix)).run_once()
    finally:
        await depths.close()
    [refine] = [m for m in measured if m.queue.endswith(".jobs.scrap_refine")]
    assert (refine.runnable, refine.waiting) == (0, 2)

    await eventually(
        lambda: _all(db, waiting.job_ids, "COMPLETED"),
        within=WINDOW * 3 + 30,
        what="the waiting jobs ran after the reset",
        interval=0.5,
        context=lambda: stack.logs(tail=3000),
    )
    outcomes = [row["outcome"] for row in await try_rows(db, waiting.job_ids)]
    assert "retry" not in outcomes, outcomes  # waiting spent no try
    assert "rate_limited" in outcomes, outcomes
    for job_id in waiting.job_ids:
        view = (
            await api.get(f"/async-jobs/{job_id}", headers=await owner_headers(db, job_id, token))
        ).json()
        assert (view["status"], view["waitingFor"], view["availableAt"]) == (
            "COMPLETED",
            None,
            None,
        )


async def _all(db: async_sessionmaker[AsyncSession], job_ids: list[uuid.UUID], status: str) -> bool:
    return (await statuses(db, job_ids)) == {status: len(job_ids)}


async def test_jobs_held_back_by_fair_share_say_so_and_still_count_as_runnable(
    stack: FaultStack,
    db: async_sessionmaker[AsyncSession],
    api: httpx.AsyncClient,
    token: Callable[[str], str],
    amqp_url: str,
) -> None:
    """No worker yet: the queue's window is its minimum (5). Two users have fifteen jobs
    each due when the relay starts (one user's backlog alone would go into the queue's bulk
    lane, held back from nobody), so the relay admits five, round-robin — three of the
    first user's, the earlier — and holds the rest in the outbox. The first user's twelve
    held say `fair-share`, the three in the queue say nothing; all thirty are runnable
    work (a worker's consumer widens the window). Once a worker runs, every job completes
    and says nothing more."""
    backlog = await seed(db, 15, [JobType.SCRAP_REFINE], label="held")
    other = await seed(db, 15, [JobType.SCRAP_REFINE], label="held-too")
    stack.start("relay", RELAY_WINDOW_MIN="5")
    queue = Topology(stack.prefix).queue_name(JobType.SCRAP_REFINE)
    depths = QueueDepths(amqp_url)
    try:

        async def window_full() -> bool:
            depth = await depths.read(queue)
            return depth is not None and depth.ready == 5

        await eventually(window_full, within=30, what="the window filled", context=stack.logs)
        headers = await owner_headers(db, backlog.job_ids[0], token)

        async def said() -> list[str | None]:
            views = [
                (await api.get(f"/async-jobs/{j}", headers=headers)).json() for j in backlog.job_ids
            ]
            assert all(v["availableAt"] is None for v in views), views
            return [v["waitingFor"] for v in views]

        async def twelve_held() -> bool:  # held for longer than the API's grace
            return Counter(await said()) == {"fair-share": 12, None: 3}

        await eventually(twelve_held, within=10, what="twelve jobs held back by fair share")
        listed = (await api.get("/async-jobs?limit=100", headers=headers)).json()["items"]
        assert sum(item["waitingFor"] == "fair-share" for item in listed) == 12
        measured = await RunnableGauge(db, depths, Topology(stack.prefix)).run_once()
    finally:
        await depths.close()
    [refine] = [m for m in measured if m.queue == queue]
    assert (refine.ready, refine.due, refine.runnable, refine.waiting) == (5, 25, 30, 0)

    stack.start("ai-worker")
    await eventually(
        lambda: _all(db, backlog.job_ids + other.job_ids, "COMPLETED"),
        within=120,
        what="the backlog ran",
        interval=0.5,
        context=lambda: stack.logs(tail=3000),
    )
    assert set(await said()) == {None}
