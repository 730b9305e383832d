"""Acceptance 6: `GET /async-jobs/{id}/events` streams PENDING → PROCESSING → COMPLETED to
the job's owner (fed by LISTEN/NOTIFY), 404 to anyone else, and a client reconnecting with
`Last-Event-ID` misses nothing. Served by uvicorn: SSE needs a real streaming server."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from san_api.app import create_app
from san_api.job_events.hub import ALL_JOBS, JobEventHub
from san_common.models import AsyncJob
from tests.admin.support import Sessions, insert_jobs, new_user, user_headers
from tests.api.support import assert_problem, over_http
from tests.conftest import api_settings
from tests.tcp_proxy import TcpProxy
from tests.waiting import eventually

WITHIN = 30.0


@pytest.fixture
async def base_url(db_url: str, amqp_url: str) -> AsyncIterator[str]:
    async with over_http(create_app(api_settings(db_url, amqp_url))) as url:
        yield url


async def set_status(sessions: Sessions, job_id: uuid.UUID, status: str) -> None:
    async with sessions() as session, session.begin():
        await session.execute(
            update(AsyncJob).where(AsyncJob.job_id == job_id).values(status=status)
        )


async def read_events(lines: AsyncIterator[str], count: int) -> list[dict[str, Any]]:
    """The next `count` events (id + data) from an open stream's lines; comments skipped."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    async with asyncio.timeout(WITHIN):
        while len(events) < count:
            line = await anext(lines)
            if line.startswith("id: "):
                current["id"] = line[4:]
            elif line.startswith("data: "):
                current["data"] = json.loads(line[6:])
            elif line == "" and "data" in current:
                events.append(current)
                current = {}
    return events


async def test_owner_sees_every_status_change_and_the_stream_ends(
    base_url: str, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    [job_id] = await insert_jobs(sessions, user_id, status="PENDING")
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=WITHIN) as client,
        client.stream("GET", f"/async-jobs/{job_id}/events", headers=user_headers(external)) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.aiter_lines()
        [pending] = await read_events(lines, 1)
        assert pending["data"]["status"] == "PENDING"
        await set_status(sessions, job_id, "PROCESSING")
        [processing] = await read_events(lines, 1)
        await set_status(sessions, job_id, "COMPLETED")
        [completed] = await read_events(lines, 1)
        assert [processing["data"]["status"], completed["data"]["status"]] == [
            "PROCESSING",
            "COMPLETED",
        ]
        assert int(pending["id"]) < int(processing["id"]) < int(completed["id"])
        rest = [line async for line in lines]  # final: the server ends the stream
        assert not any(line.startswith("data:") for line in rest)


async def test_reconnecting_with_last_event_id_misses_nothing(
    base_url: str, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    [job_id] = await insert_jobs(sessions, user_id, status="PENDING")
    headers = user_headers(external)
    url = f"/async-jobs/{job_id}/events"
    async with httpx.AsyncClient(base_url=base_url, timeout=WITHIN) as client:
        async with client.stream("GET", url, headers=headers) as r:
            lines = r.aiter_lines()
            [first] = await read_events(lines, 1)
        # disconnected: changes happen meanwhile
        await set_status(sessions, job_id, "PROCESSING")
        await set_status(sessions, job_id, "COMPLETED")
        resumed = {**headers, "Last-Event-ID": first["id"]}
        async with client.stream("GET", url, headers=resumed) as r:
            lines = r.aiter_lines()
            events = await read_events(lines, 2)
        assert [e["data"]["status"] for e in events] == ["PROCESSING", "COMPLETED"]
        # seen everything of a final job: 204 tells EventSource to stop reconnecting
        done = await client.get(url, headers={**headers, "Last-Event-ID": events[-1]["id"]})
        assert done.status_code == 204


async def test_anyone_else_gets_404_and_bad_input_400(base_url: str, sessions: Sessions) -> None:
    user_id, _ = await new_user(sessions)
    _, stranger = await new_user(sessions)
    [job_id] = await insert_jobs(sessions, user_id, status="PENDING")
    async with httpx.AsyncClient(base_url=base_url, timeout=WITHIN) as client:
        url = f"/async-jobs/{job_id}/events"
        assert_problem(await client.get(url, headers=user_headers(stranger)), 404, "NOT_FOUND")
        assert_problem(await client.get(url), 401, "UNAUTHORIZED")
        for bad in ("abc", "-1", "99999999999999999999"):
            response = await client.get(
                url, headers={**user_headers(stranger), "Last-Event-ID": bad}
            )
            assert_problem(response, 400, "VALIDATION_ERROR")
        response = await client.get("/async-jobs/nope/events", headers=user_headers(stranger))
        assert_problem(response, 400, "VALIDATION_ERROR")


async def test_a_silent_database_fails_a_subscription_in_time_and_listening_resumes(
    db_url: str,
) -> None:
    """A partition (no reset) while the hub connects its listener: the subscriber fails
    within the timeout (the API's 503), instead of hanging on the connect; healed, the
    next subscriber listens."""
    with TcpProxy(db_url) as proxy:
        hub = JobEventHub(proxy.url, timeout_seconds=0.5)
        try:
            proxy.freeze()
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(20):  # the test's own bound, should the hub have none
                    async with hub.subscribe(ALL_JOBS):
                        pass
            assert loop.time() - started < 10, "the hub waited on the silent server unbounded"
            proxy.thaw()
            async with asyncio.timeout(10), hub.subscribe(ALL_JOBS) as subscription:
                assert subscription.job_id is ALL_JOBS
        finally:
            await hub.aclose()


async def test_a_listener_that_goes_silent_is_replaced_and_notifications_flow_again(
    db_url: str,
) -> None:
    """The listening connection is stranded after it connected (no reset; new connections
    pass): no notification reaches it and no error says so. The hub's probe finds it
    silent, wakes every subscriber (what was missed is in the log) and listens on a new
    connection, where notifications arrive again."""
    import asyncpg

    from san_common.db.engine import plain_url

    async def notify(job_id: uuid.UUID) -> None:
        connection = await asyncpg.connect(plain_url(db_url))
        try:
            await connection.execute("SELECT pg_notify('san_job_events', $1)", f"{job_id}:x")
        finally:
            await connection.close()

    job_id = uuid.uuid4()
    with TcpProxy(db_url) as proxy:
        hub = JobEventHub(proxy.url, timeout_seconds=0.5, probe_seconds=0.5)
        try:
            async with hub.subscribe(job_id) as subscription:
                subscription.wake.clear()
                await notify(job_id)
                await asyncio.wait_for(subscription.wake.wait(), WITHIN)

                proxy.strand()
                subscription.wake.clear()
                await notify(job_id)  # lost with the stranded connection
                await asyncio.wait_for(subscription.wake.wait(), WITHIN)  # by the probe

                async def heard() -> bool:
                    subscription.wake.clear()
                    await notify(job_id)
                    try:
                        await asyncio.wait_for(subscription.wake.wait(), 1.0)
                    except TimeoutError:
                        return False
                    return True

                # the reconnect wakes everyone too; then each notification must arrive
                await eventually(heard, within=WITHIN, what="notifications on a new listener")
                assert await heard() and await heard()
        finally:
            await hub.aclose()
