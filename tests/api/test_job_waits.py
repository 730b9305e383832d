"""`GET /async-jobs/{id}`'s `waitingFor` and `availableAt`: what a PENDING job waits for,
set by the lifecycle when a try meets a quota or a budget, shown while the wait lasts and
never for a plain retry's backoff."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import get_args

import httpx
import pytest

from san_api.jobs.endpoints import WaitingFor
from san_common.errors import WAITING_FOR
from san_common.jobs import lifecycle
from san_common.jobs.lifecycle import TryOutcome
from tests.api.support import Sessions, save_scrap


async def _try_ends(
    sessions: Sessions,
    job_id: uuid.UUID,
    *,
    delay: float,
    waiting_for: str | None,
    waiting_key: str | None = None,
) -> datetime:
    """A worker's try of the job, ended as the executor ends one that must wait."""
    async with sessions() as session, session.begin():
        connection = await session.connection()
        got = await lifecycle.claim_batch(connection, [job_id], "worker-w", timedelta(seconds=30))
        claimed = got[job_id]
        assert isinstance(claimed, lifecycle.Claimed)
        at = await lifecycle.retry_later(
            session,
            job_id,
            claimed.job.tries,
            delay=timedelta(seconds=delay),
            error="waiting",
            summary="waiting",
            outcome=TryOutcome.RATE_LIMITED if waiting_for else TryOutcome.RETRY,
            waiting_for=waiting_for,
            waiting_key=waiting_key,
        )
    assert at is not None
    return at


async def _job(api: httpx.AsyncClient, headers: dict[str, str], job_id: uuid.UUID) -> dict:
    response = await api.get(f"/async-jobs/{job_id}", headers=headers)
    assert response.status_code == 200, response.text
    body: dict = response.json()
    return body


@pytest.mark.parametrize("reason", ["upstream-quota", "budget"])
async def test_a_job_waiting_for_a_reset_says_what_for_and_until_when(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]], reason: str
) -> None:
    alice = new_user()
    saved = await save_scrap(api, alice)
    job_id = uuid.UUID(saved["refineJobId"])
    fresh = await _job(api, alice, job_id)
    assert (fresh["waitingFor"], fresh["availableAt"]) == (None, None)

    key = "ai http://ai/v1 model" if reason == "upstream-quota" else None
    at = await _try_ends(sessions, job_id, delay=120, waiting_for=reason, waiting_key=key)
    view = await _job(api, alice, job_id)
    assert view["status"] == "PENDING"
    assert view["waitingFor"] == reason
    assert datetime.fromisoformat(view["availableAt"]) == at
    # the list shows the same
    listed = (await api.get("/async-jobs", headers=alice)).json()["items"]
    [same] = [j for j in listed if j["jobId"] == str(job_id)]
    assert (same["waitingFor"], same["availableAt"]) == (view["waitingFor"], view["availableAt"])

    # A plain retry's backoff is not a wait for anything.
    other = uuid.UUID(saved["analysisJobId"])
    await _try_ends(sessions, other, delay=120, waiting_for=None)
    retried = await _job(api, alice, other)
    assert retried["nextAttemptAt"] is not None
    assert (retried["waitingFor"], retried["availableAt"]) == (None, None)


async def test_a_wait_whose_reset_has_passed_is_no_longer_shown(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    alice = new_user()
    job_id = uuid.UUID((await save_scrap(api, alice))["refineJobId"])
    await _try_ends(sessions, job_id, delay=0, waiting_for="upstream-quota", waiting_key="k")
    view = await _job(api, alice, job_id)  # due now: it runs as soon as a worker takes it
    assert (view["status"], view["waitingFor"], view["availableAt"]) == ("PENDING", None, None)


async def test_a_cancelled_job_that_was_waiting_says_nothing(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    alice = new_user()
    job_id = uuid.UUID((await save_scrap(api, alice))["refineJobId"])
    await _try_ends(sessions, job_id, delay=120, waiting_for="upstream-quota", waiting_key="k")
    cancelled = await api.delete(f"/async-jobs/{job_id}", headers=alice)
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["status"], cancelled.json()["waitingFor"]) == ("CANCELLED", None)


def test_the_api_names_every_wait_the_database_allows() -> None:
    assert set(get_args(WaitingFor)) == set(WAITING_FOR)
