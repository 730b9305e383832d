"""The fleet at a glance (docs/operations.md, "Console"): the workers with what each runs
and its last beat, wait and run time percentiles per job type, the oldest due job per
queue, and job search by id prefix — each checked against rows whose answer is known."""

from __future__ import annotations

import asyncio
import math
import socket
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import httpx
import pytest
from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.broker.topology import Topology
from san_common.jobs import registry
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, AsyncJobTry, WorkerPresence
from san_common.worker import JobHandler
from san_common.worker.presence import Presence
from tests.admin.support import Sessions, insert_jobs, new_user, operator_headers
from tests.faults.harness import seed
from tests.running import worker_and_relay
from tests.waiting import eventually

OPERATOR = operator_headers("fleet-operator")


class Gated(JobHandler[None, str]):
    """Runs until `gate` opens; writes nothing."""

    job_type: ClassVar[str] = JobType.SCRAP_REFINE

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate

    async def run(self, job: AsyncJob, payload: None) -> str:
        await self.gate.wait()
        return "done"

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        return None


async def _workers(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await api.get("/admin/api/workers", headers=OPERATOR)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


@pytest.mark.rabbit
async def test_a_worker_is_listed_with_the_jobs_it_holds_and_leaves_when_it_stops(
    api: httpx.AsyncClient, sessions: Sessions, fresh_db_url: str, amqp_url: str, topology: Topology
) -> None:
    gate = asyncio.Event()
    async with worker_and_relay(
        sessions, fresh_db_url, amqp_url, topology, {JobType.SCRAP_REFINE: Gated(gate)}
    ) as runtime:
        try:
            await seed(sessions, 2, [JobType.SCRAP_REFINE])
            seen: list[dict[str, Any]] = []

            async def holds_both() -> bool:
                seen[:] = await _workers(api)
                return bool(seen) and seen[0]["inFlight"] == 2

            await eventually(holds_both, within=30, what="the worker holding both jobs")
            [worker] = seen
            assert worker["workerId"] == runtime.worker_id
            assert worker["host"] == socket.gethostname() and worker["alive"] is True
            assert worker["jobTypes"] == ["SCRAP_REFINE"]
            assert worker["running"] == {"SCRAP_REFINE": 2}
            assert worker["silentSeconds"] <= 3 * worker["beatSeconds"]
        finally:
            gate.set()
    assert await _workers(api) == [], "a worker that stopped cleanly is still listed"


async def test_a_silent_worker_is_shown_gone_and_forgotten_after_a_day(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    quiet = Presence(sessions, worker_id="quiet", job_types=["CARD_ANALYSIS"], interval=2.0)
    ancient = Presence(sessions, worker_id="ancient", job_types=["CARD_ANALYSIS"], interval=2.0)
    await quiet.beat()
    await ancient.beat()
    async with sessions() as session, session.begin():
        for worker_id, silent in (("quiet", timedelta(seconds=7)), ("ancient", timedelta(days=2))):
            await session.execute(
                update(WorkerPresence)
                .where(WorkerPresence.worker_id == worker_id)
                .values(heartbeat_at=datetime.now(UTC) - silent)
            )
    [worker] = [w for w in await _workers(api) if w["workerId"] == "quiet"]
    assert worker["alive"] is False and worker["silentSeconds"] >= 7  # three beats: 6 s
    beating = Presence(sessions, worker_id="beating", job_types=["SCRAP_REFINE"], interval=2.0)
    await beating.beat()
    listed = {w["workerId"]: w["alive"] for w in await _workers(api)}
    assert listed == {"quiet": False, "beating": True}


def percentile_cont(values: list[float], p: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    ordered = sorted(values)
    rank = p * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def _finished_jobs(
    sessions: Sessions, user_id: uuid.UUID, job_type: str, times: list[tuple[float, float, float]]
) -> None:
    """A job per (minutes ago it finished, seconds it waited, seconds its last try ran)."""
    now = datetime.now(UTC)
    jobs, tries = [], []
    for ago, wait, run in times:
        finished = now - timedelta(minutes=ago)
        started = finished - timedelta(seconds=run)
        created = started - timedelta(seconds=wait)
        job_id = uuid.uuid4()
        jobs.append(
            {
                "job_id": job_id,
                "job_type": job_type,
                "target_id": uuid.uuid4(),
                "user_id": user_id,
                "status": "COMPLETED",
                "created_at": created,
                "started_at": started,
                "finished_at": finished,
                "tries": 1,
            }
        )
        tries.append(
            {"job_id": job_id, "try_no": 1, "started_at": started, "finished_at": finished}
        )
    async with sessions() as session, session.begin():
        await session.execute(insert(AsyncJob), jobs)
        await session.execute(insert(AsyncJobTry), tries)


async def test_wait_and_run_percentiles_cover_the_last_hour_per_job_type(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, _ = await new_user(sessions)
    waits = [float(w) for w in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89)]
    runs = [0.5 * w for w in reversed(waits)]
    await _finished_jobs(
        sessions,
        user_id,
        "CARD_ANALYSIS",
        [(5 + i, w, r) for i, (w, r) in enumerate(zip(waits, runs, strict=True))],
    )
    await _finished_jobs(sessions, user_id, "CARD_ANALYSIS", [(90, 5000, 5000)])  # too old
    await _finished_jobs(sessions, user_id, "SCRAP_REFINE", [(1, 4, 2)])
    response = await api.get("/admin/api/timings", headers=OPERATOR)
    assert response.status_code == 200, response.text
    by_type = {t["jobType"]: t for t in response.json()["jobTypes"]}
    card = by_type["CARD_ANALYSIS"]
    assert card["finished"] == 10
    for key, values, p in (
        ("waitP50", waits, 0.5),
        ("waitP95", waits, 0.95),
        ("runP50", runs, 0.5),
        ("runP95", runs, 0.95),
    ):
        assert card[key] == pytest.approx(percentile_cont(values, p), abs=1e-3), key
    assert by_type["SCRAP_REFINE"]["waitP95"] == pytest.approx(4, abs=1e-3)
    wider = (await api.get("/admin/api/timings?minutes=120", headers=OPERATOR)).json()
    assert {t["jobType"]: t["finished"] for t in wider["jobTypes"]}["CARD_ANALYSIS"] == 11


async def test_the_oldest_due_pending_job_per_queue(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, _ = await new_user(sessions)
    long_ago = datetime.now(UTC) - timedelta(minutes=10)
    await insert_jobs(sessions, user_id, 2, status="PENDING", created_at=long_ago)  # stuck
    [waiting] = await insert_jobs(sessions, user_id, status="PENDING", created_at=long_ago)
    async with sessions() as session, session.begin():  # a retry due later: not late
        await session.execute(
            update(AsyncJob)
            .where(AsyncJob.job_id == waiting)
            .values(next_attempt_at=datetime.now(UTC) + timedelta(minutes=5))
        )
    await insert_jobs(sessions, user_id, status="PENDING", job_type="SCRAP_REFINE")
    response = await api.get("/admin/api/timings", headers=OPERATOR)
    assert response.status_code == 200, response.text
    queues = {tuple(q["jobTypes"]): q for q in response.json()["queues"]}
    card = queues[("CARD_ANALYSIS",)]
    assert (card["pending"], card["due"]) == (3, 2)
    assert 600 <= card["oldestDueSeconds"] < 660
    assert card["queue"].endswith(f".jobs.{registry.spec_for('CARD_ANALYSIS').queue}")
    assert queues[("SCRAP_REFINE",)]["oldestDueSeconds"] < 60


async def test_jobs_are_found_by_the_start_of_their_id(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, _ = await new_user(sessions)
    ids = await insert_jobs(sessions, user_id, 20)
    wanted = ids[7]
    for prefix in (str(wanted)[:8], str(wanted)[:13].upper(), str(wanted).replace("-", "")[:12]):
        response = await api.get("/admin/api/jobs", params={"jobId": prefix}, headers=OPERATOR)
        assert response.status_code == 200, response.text
        found = {j["jobId"] for j in response.json()["items"]}
        expected = {str(i) for i in ids if str(i).replace("-", "").startswith(
            prefix.replace("-", "").lower())}  # fmt: skip
        assert wanted in {uuid.UUID(f) for f in found} and found == expected, prefix
    for bad in ("xyz", "0" * 33, "", "a" * 37):
        response = await api.get("/admin/api/jobs", params={"jobId": bad}, headers=OPERATOR)
        assert response.status_code == 400, (bad, response.text)
