"""Issue 35: a PostgreSQL outage is logged as one WARNING per service when it starts and one
INFO when it ends, not as tracebacks. PostgreSQL (this test's own server) is stopped with
`pg_ctl -m fast` for 8 s under the API, the relay, a worker and the maintenance service —
OS processes, with work flowing before and after — and their log records are counted."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.auth.tokens import mint
from san_common.jobs.types import JobType
from tests import infra
from tests.conftest import JWT_SECRET
from tests.faults.harness import FaultStack, json_lines
from tests.faults.postgres import DedicatedPostgres
from tests.procs import ServiceProcess
from tests.recovery.seed import Seed, utcnow
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(240)]

DOWN_SECONDS = 8.0
STARTED = "PostgreSQL unreachable; retrying until it answers"
ENDED = "PostgreSQL answers again"


def _records(process: ServiceProcess, since: str) -> list[dict[str, Any]]:
    return [line for line in json_lines(process.log()) if str(line.get("ts", "")) >= since]


def _worth_reading(line: dict[str, Any]) -> bool:
    return line.get("level") in ("warning", "error", "critical") or "exc" in line


async def _post_scrap(client: httpx.AsyncClient) -> int:
    # a user of its own each time: the API's per-user rate limit is not under test
    headers = {"Authorization": f"Bearer {mint(JWT_SECRET, 'outage-' + uuid.uuid4().hex)}"}
    try:
        response = await client.post(
            "/scraps", json={"content": f"outage {uuid.uuid4()}"}, headers=headers
        )
    except httpx.HTTPError:
        return 0
    return response.status_code


async def test_an_outage_is_one_warning_and_one_info_per_service(
    own_stack: FaultStack,
    own_db: async_sessionmaker[AsyncSession],
    own_postgres: DedicatedPostgres,
    tmp_path: Path,
) -> None:
    stack = own_stack
    port = infra.free_port()
    services = {
        "api": stack.start("api", API_HOST="127.0.0.1", API_PORT=str(port), AI_PROVIDER="local"),
        "relay": stack.start("relay"),
        "ai-worker": stack.start("ai-worker", AI_PROVIDER="local"),
        # its operators' requests, lease rescue and stranded check poll every few seconds
        "recovery": stack.start("recovery"),
    }
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

        async def api_accepts() -> bool:
            return await _post_scrap(client) == 202

        await eventually(
            api_accepts, within=60, what="the API accepting scraps", interval=0.5,
            context=stack.logs,
        )  # fmt: skip
        # a client following a job's events: the API listens on PostgreSQL for it
        subject, job_id = await _job_held_by_a_worker(own_db)
        stream_headers = {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"}
        following = asyncio.create_task(_follow(client, job_id, stream_headers))
        await eventually(
            lambda: _streaming(following), within=30, what="the event stream open",
            context=stack.logs,
        )  # fmt: skip
        await db_dispose(own_db)
        since = _now_iso()
        await asyncio.to_thread(own_postgres.stop_fast)
        stopped = time.monotonic()
        while time.monotonic() - stopped < DOWN_SECONDS:  # clients keep asking meanwhile
            assert await _post_scrap(client) in (0, 503)
            await asyncio.sleep(0.5)
        await asyncio.to_thread(own_postgres.start)
        assert (await asyncio.wait_for(following, 30)) == 200, "the stream ended cleanly"
        await eventually(
            api_accepts, within=60, what="the API accepting scraps again", interval=0.5
        )

        async def every_service_saw_the_end() -> bool:
            return all(
                any(r.get("msg") == ENDED for r in _records(p, since)) for p in services.values()
            )

        await eventually(
            every_service_saw_the_end, within=60, what="every service logging the outage's end",
            context=stack.logs,
        )  # fmt: skip
    for name, process in services.items():
        records = _records(process, since)
        loud = [r for r in records if _worth_reading(r)]
        assert [r.get("msg") for r in loud] == [STARTED], (name, loud)
        ends = [r for r in records if r.get("msg") == ENDED]
        assert len(ends) == 1 and ends[0]["level"] == "info", (name, ends)


async def _job_held_by_a_worker(db: async_sessionmaker[AsyncSession]) -> tuple[str, uuid.UUID]:
    """A user (its token subject) and a CARD_ANALYSIS job of theirs that a worker holds
    under a lease far from expiry: its event stream stays open until something happens."""
    seed = Seed(db, utcnow())
    user_id = await seed.user()
    job_id = await seed.job(
        JobType.CARD_ANALYSIS,
        await seed.scrap(user_id),
        user_id,
        status="PROCESSING",
        started=seed.now,
        lease_until=seed.now + timedelta(hours=1),
    )
    subject = f"outage-stream-{uuid.uuid4().hex}"
    async with db() as session, session.begin():
        await session.execute(
            text("UPDATE users SET external_id = :subject WHERE id = :id"),
            {"subject": subject, "id": user_id},
        )
    return subject, job_id


_opened: set[asyncio.Task[int]] = set()


async def _follow(client: httpx.AsyncClient, job_id: uuid.UUID, headers: dict[str, str]) -> int:
    """Read the job's event stream until the API ends it; its status code."""
    url = f"/async-jobs/{job_id}/events"
    async with client.stream("GET", url, headers=headers, timeout=120) as response:
        current = asyncio.current_task()
        assert current is not None
        _opened.add(current)  # type: ignore[arg-type]
        async for _ in response.aiter_raw():
            pass
        return response.status_code


async def _streaming(task: asyncio.Task[int]) -> bool:
    if task.done():
        raise AssertionError(f"the stream ended early: {task.result()}")
    return task in _opened


async def db_dispose(db: async_sessionmaker[AsyncSession]) -> None:
    await db.kw["bind"].dispose()  # the test's own pool would only hold dead connections


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
