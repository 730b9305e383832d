"""The GitHub budget of a token, shared through PostgreSQL (docs/architecture.md, "Upstream
quotas"): once GitHub announces what is left, the jobs that would exceed it wait PENDING
until the reset without calling GitHub and without spending a try."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.github.support import DAY, World
from tests.waiting import settled_job

pytestmark = pytest.mark.rabbit

RESET_IN = 6.0  # seconds until the fake's window resets
LIMIT = 5


@pytest.fixture
def upstream_quotas_on() -> bool:
    return True


async def test_commits_past_the_announced_limit_wait_for_the_reset(worker_world: World) -> None:
    world = worker_world
    ada = await world.ready()
    summaries = [await world.til(ada, day=DAY - timedelta(days=n)) for n in range(20)]
    started = time.time()  # linking and connecting called GitHub before
    reset_at = world.github.rate_limit(LIMIT, reset_in=RESET_IN)
    jobs = [
        (await world.register_directly(ada, summary, f"TIL/{n}.md"))[1]
        for n, summary in enumerate(summaries)
    ]

    settled = [await settled_job(world.sessions, job_id, within=60) for job_id in jobs]

    assert [job.status for job in settled] == ["COMPLETED"] * 20, [
        job.error_message for job in settled
    ]
    calls = world.github.requests_with(ada.token)
    before_reset = [call for call in calls if started <= call.wall < reset_at]
    assert len(before_reset) <= LIMIT, [(c.method, c.path) for c in before_reset]
    assert world.github.over_limit == 0
    for n in range(20):
        assert world.github.file(ada.login, "til", f"TIL/{n}.md") is not None
    async with world.sessions() as session:
        outcomes = dict(
            (
                await session.execute(
                    text(
                        "SELECT outcome, count(*) FROM async_job_tries"
                        " WHERE job_id = ANY(:jobs) GROUP BY outcome"
                    ),
                    {"jobs": jobs},
                )
            ).all()
        )
    # The waits happened, as waits: no try of any job was spent on them.
    assert outcomes.get("rate_limited", 0) > 0, outcomes
    assert set(outcomes) <= {"completed", "rate_limited"}, outcomes
