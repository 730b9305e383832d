"""Event streams cannot starve the API (docs/security.md, "Event streams"): a user holds at
most `SSE_STREAMS_PER_USER` streams (beyond: 429 problem+json with `Retry-After`), a process
at most `SSE_STREAMS_MAX` (beyond: 503), a stream ends after `SSE_STREAM_MAX_SECONDS` and its
client resumes with `Last-Event-ID` losing nothing, and while one user floods the stream
endpoint, other users and the probes are served.

The flood runs against the real `san-api` process, whose memory per open stream it measures
and reports."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from san_api.app import create_app
from tests import infra
from tests.admin.support import Sessions, insert_jobs, new_user, user_headers
from tests.api.support import assert_problem, over_http
from tests.api.test_job_events import read_events, set_status
from tests.conftest import JWT_SECRET, TOKEN_KEYS, api_settings
from tests.procs import start, wait_healthy

WITHIN = 30.0
STREAMS_PER_USER = 10  # the default: the real process runs without the setting


@pytest.fixture
def api_process(db_url: str, amqp_url: str, tmp_path: Path) -> Iterator[tuple[str, int]]:
    port = infra.free_port()
    env = {
        "DATABASE_URL": db_url,
        "AMQP_URL": amqp_url,
        "AUTH_JWT_SECRET": JWT_SECRET,
        "TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS,
        "API_PORT": str(port),
        "SAN_ENV": "test",
        "DATA_DIR": str(tmp_path / "data"),
    }
    process = start("api", env, tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, timeout=120)
        yield url, process.popen.pid
    finally:
        process.terminate()
    assert "Traceback" not in process.log(), process.log()[-3000:]


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class OpenStreams:
    """Streams opened and held (each on a connection of its own) until the block ends."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.stack = contextlib.AsyncExitStack()
        self.refused: list[httpx.Response] = []
        # the open streams' line readers: one garbage-collected would close its stream
        self.readers: list[AsyncIterator[str]] = []

    @property
    def held(self) -> int:
        return len(self.readers)

    async def open(self, url: str, headers: dict[str, str]) -> None:
        response = await self.stack.enter_async_context(
            self.client.stream("GET", url, headers=headers)
        )
        if response.status_code == 200:
            lines = response.aiter_lines()
            await read_events(lines, 1)  # the server is inside the stream
            self.readers.append(lines)
        else:
            await response.aread()
            self.refused.append(response)


@contextlib.asynccontextmanager
async def holding(client: httpx.AsyncClient) -> AsyncIterator[OpenStreams]:
    streams = OpenStreams(client)
    async with streams.stack:
        yield streams


async def test_one_user_flooding_streams_is_capped_and_others_and_probes_are_served(
    api_process: tuple[str, int], sessions: Sessions, record_property: pytest.RecordProperty
) -> None:
    url, pid = api_process
    flooder_id, flooder = await new_user(sessions)
    [job_id] = await insert_jobs(sessions, flooder_id, status="PENDING")
    _, other = await new_user(sessions)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=0)
    async with (
        httpx.AsyncClient(base_url=url, timeout=WITHIN, limits=limits) as client,
        holding(client) as streams,
    ):
        await client.get("/me", headers=user_headers(flooder))  # warm: one-time allocations
        before = _rss_bytes(pid)
        events = f"/async-jobs/{job_id}/events"
        await asyncio.gather(*(streams.open(events, user_headers(flooder)) for _ in range(60)))

        assert streams.held == STREAMS_PER_USER
        assert len(streams.refused) == 60 - STREAMS_PER_USER
        for refused in streams.refused:
            body = assert_problem(refused, 429, "TOO_MANY_STREAMS")
            assert int(refused.headers["retry-after"]) >= 1 and body["limit"] == STREAMS_PER_USER
        # meanwhile: another user, and the probes
        for path, headers in (("/me", user_headers(other)), ("/healthz", {}), ("/readyz", {})):
            answer = await client.get(path, headers=headers)
            assert answer.status_code == 200, (path, answer.text)

        # memory per stream: nine more users fill their own caps (100 streams in all)
        for _ in range(9):
            user_id, subject = await new_user(sessions)
            [job] = await insert_jobs(sessions, user_id, status="PENDING")
            await asyncio.gather(
                *(
                    streams.open(f"/async-jobs/{job}/events", user_headers(subject))
                    for _ in range(STREAMS_PER_USER)
                )
            )
        assert streams.held == 10 * STREAMS_PER_USER
        grown = _rss_bytes(pid) - before
        per_stream = grown / streams.held
        record_property("rss_growth_bytes", grown)
        record_property("rss_per_stream_bytes", round(per_stream))
        print(f"\n{streams.held} open event streams: RSS +{grown / 2**20:.1f} MiB, "
              f"{per_stream / 1024:.1f} KiB per stream")  # fmt: skip
        assert per_stream < 256 * 1024, per_stream  # docs/security.md states the figure

    # the streams closed: their slots are free again
    async with httpx.AsyncClient(base_url=url, timeout=WITHIN) as client:
        async with client.stream("GET", events, headers=user_headers(flooder)) as again:
            assert again.status_code == 200


async def test_the_process_bound_refuses_with_503_beyond_it(
    db_url: str, amqp_url: str, sessions: Sessions
) -> None:
    settings = api_settings(db_url, amqp_url, sse_streams_max=3, sse_streams_per_user=2)
    app = create_app(settings)
    async with (
        over_http(app) as url,
        httpx.AsyncClient(base_url=url, timeout=WITHIN) as client,
        holding(client) as streams,
    ):
        for _ in range(2):
            user_id, subject = await new_user(sessions)
            [job_id] = await insert_jobs(sessions, user_id, status="PENDING")
            for _ in range(2):
                await streams.open(f"/async-jobs/{job_id}/events", user_headers(subject))
        assert streams.held == 3 == app.state.stream_slots.open
        [refused] = streams.refused
        assert_problem(refused, 503, "STREAMS_BUSY")
        assert int(refused.headers["retry-after"]) >= 1


def test_the_process_bound_must_be_below_the_connection_cap(db_url: str, amqp_url: str) -> None:
    with pytest.raises(ValueError, match="SSE_STREAMS_MAX must be below HTTP_MAX_CONNECTIONS"):
        api_settings(db_url, amqp_url, sse_streams_max=500, http_max_connections=500)
    assert api_settings(db_url, amqp_url).streams_max == 200  # unset: 40 % of 500
    assert api_settings(db_url, amqp_url, http_max_connections=3).streams_max == 1


async def test_a_stream_past_its_lifetime_is_closed_and_resuming_loses_nothing(
    db_url: str, amqp_url: str, sessions: Sessions
) -> None:
    lifetime = 1.5
    settings = api_settings(db_url, amqp_url, sse_stream_max_seconds=lifetime)
    user_id, subject = await new_user(sessions)
    [job_id] = await insert_jobs(sessions, user_id, status="PENDING")
    url, headers = f"/async-jobs/{job_id}/events", user_headers(subject)
    seen: list[str] = []
    async with (
        over_http(create_app(settings)) as base,
        httpx.AsyncClient(base_url=base, timeout=WITHIN) as client,
    ):
        started = asyncio.get_running_loop().time()
        async with client.stream("GET", url, headers=headers) as first:
            lines = first.aiter_lines()
            seen += [e["data"]["status"] for e in await read_events(lines, 1)]
            await set_status(sessions, job_id, "PROCESSING")
            [processing] = await read_events(lines, 1)
            seen.append(processing["data"]["status"])
            last_id = processing["id"]
            rest = [line async for line in lines]  # until the server ends the stream
        took = asyncio.get_running_loop().time() - started
        assert lifetime <= took < lifetime + 5, took  # the job is not final: the lifetime
        assert any("Last-Event-ID" in line for line in rest), rest
        # while no stream is open, the job moves on: released, claimed again, completed
        for status in ("PENDING", "PROCESSING", "COMPLETED"):
            await set_status(sessions, job_id, status)
        resumed = {**headers, "Last-Event-ID": last_id}
        async with client.stream("GET", url, headers=resumed) as second:
            events = await read_events(second.aiter_lines(), 3)
        seen += [e["data"]["status"] for e in events]
        assert int(events[0]["id"]) > int(last_id)
    assert seen == ["PENDING", "PROCESSING", "PENDING", "PROCESSING", "COMPLETED"], seen
