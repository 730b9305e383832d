"""Per-user rate limits and active-job quotas on the job-creating endpoints: 429 problems
with `Retry-After`, per user, and true across API replicas (the state is in PostgreSQL)."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import text, update

from san_api.auth.tokens import mint
from san_common.db.engine import plain_url
from san_common.models import AsyncJob
from tests import infra
from tests.api.support import Sessions, api_with, assert_problem, save_scrap
from tests.conftest import JWT_SECRET, TOKEN_KEYS
from tests.procs import ServiceProcess, start, wait_healthy

JOB_CREATING = [
    ("POST", "/scraps", {"content": "limited"}),
    ("POST", "/til", {"targetDate": "2026-01-01"}),
    ("POST", "/recall-quizzes", {"targetDate": "2026-01-01"}),
    ("POST", f"/til/{uuid.uuid4()}/github-commits", None),
    ("POST", "/github-star-recommendations", None),
]


def _headers(subject: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"}


def _rate_limited(response: httpx.Response, code: str = "RATE_LIMITED") -> int:
    body = assert_problem(response, 429, code)
    wait = int(response.headers["retry-after"])
    assert wait >= 1 and body["retryAfterSeconds"] == wait
    return wait


@pytest.mark.parametrize(("method", "path", "body"), JOB_CREATING, ids=lambda v: str(v))
async def test_every_job_creating_endpoint_is_rate_limited_per_user(
    settings_for: Callable[..., Any],
    new_user: Callable[[], dict[str, str]],
    method: str,
    path: str,
    body: dict[str, str] | None,
) -> None:
    settings = settings_for(rate_limit_jobs_burst=1, rate_limit_jobs_per_minute=0.5)
    async with api_with(settings) as api:
        alice, bob = new_user(), new_user()
        first = await api.request(method, path, json=body, headers=alice)
        assert first.status_code != 429, first.text  # whatever it answers, it took the token
        wait = _rate_limited(await api.request(method, path, json=body, headers=alice))
        assert 1 <= wait <= 120  # one token at 0.5 per minute
        # another user has a bucket of their own
        assert (await api.request(method, path, json=body, headers=bob)).status_code != 429


async def test_the_bucket_refills_with_time(
    settings_for: Callable[..., Any], new_user: Callable[[], dict[str, str]], sessions: Sessions
) -> None:
    settings = settings_for(rate_limit_jobs_burst=2, rate_limit_jobs_per_minute=1)
    alice = new_user()
    async with api_with(settings) as api:
        await save_scrap(api, alice)
        await save_scrap(api, alice)
        _rate_limited(await api.post("/scraps", json={"content": "third"}, headers=alice))
        # a minute passes (moved back in the bucket's clock rather than waited for)
        async with sessions() as session, session.begin():
            await session.execute(
                text("UPDATE rate_limit_buckets SET updated_at = updated_at - interval '61 s'")
            )
        await save_scrap(api, alice)
        _rate_limited(await api.post("/scraps", json={"content": "fourth"}, headers=alice))


async def test_a_refused_token_provisions_nothing_and_invalid_input_still_counts(
    settings_for: Callable[..., Any], new_user: Callable[[], dict[str, str]]
) -> None:
    settings = settings_for(rate_limit_jobs_burst=2, rate_limit_jobs_per_minute=0.1)
    alice = new_user()
    async with api_with(settings) as api:
        for _ in range(2):
            bad = await api.post("/scraps", json={"content": " "}, headers=alice)
            assert_problem(bad, 400, "VALIDATION_ERROR")
        _rate_limited(await api.post("/scraps", json={"content": "valid"}, headers=alice))


async def test_the_active_job_cap_counts_pending_and_processing_jobs_only(
    settings_for: Callable[..., Any],
    new_user: Callable[[], dict[str, str]],
    sessions: Sessions,
) -> None:
    settings = settings_for(active_jobs_max_per_user=5, active_jobs_retry_after_seconds=7)
    alice = new_user()
    async with api_with(settings) as api:
        saved = [await save_scrap(api, alice) for _ in range(2)]  # 4 active jobs
        refused = await api.post("/scraps", json={"content": "a third"}, headers=alice)
        assert _rate_limited(refused, "TOO_MANY_ACTIVE_JOBS") == 7
        assert refused.json()["activeJobs"] == 4 and refused.json()["limit"] == 5
        # a job-creating request for one job still fits
        til = await api.post("/til", json={"targetDate": "2026-01-01"}, headers=alice)
        assert til.status_code != 429, til.text

        # jobs that finished no longer count
        async with sessions() as session, session.begin():
            for status in ("PROCESSING", "COMPLETED"):  # claimed, then done
                await session.execute(
                    update(AsyncJob)
                    .where(AsyncJob.target_id == uuid.UUID(saved[0]["scrapId"]))
                    .values(status=status)
                )
        await save_scrap(api, alice)


# -- two API processes, one database -------------------------------------------------------

BURST, ACTIVE_CAP = 20, 12


@pytest.fixture
def two_apis(fresh_db_url: str, amqp_url: str, tmp_path: Path) -> Iterator[list[str]]:
    processes: list[ServiceProcess] = []
    urls = []
    try:
        for n in range(2):
            port = infra.free_port()
            env = {
                "DATABASE_URL": fresh_db_url,
                "AMQP_URL": amqp_url,
                "AUTH_JWT_SECRET": JWT_SECRET,
                "TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS,
                "API_PORT": str(port),
                "SAN_ENV": "test",
                "DATA_DIR": str(tmp_path / "data"),
                "RATE_LIMIT_JOBS_BURST": str(BURST),
                "RATE_LIMIT_JOBS_PER_MINUTE": "1",
                "ACTIVE_JOBS_MAX_PER_USER": str(ACTIVE_CAP),
                "PYTHONUNBUFFERED": "1",
                # no idle keep-alive connection is closed under the client mid-burst (on a
                # loaded machine a reused connection can race the server's idle close)
                "HTTP_KEEP_ALIVE_SECONDS": "300",
                "HTTP_HEADER_TIMEOUT_SECONDS": "300",
            }
            processes.append(start(f"api-{n}", env, tmp_path, module="san_api.main"))
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes, strict=True):
            wait_healthy(url, process, timeout=120)  # a loaded machine starts slowly
        yield urls
    finally:
        for process in processes:
            process.terminate()
    for process in processes:
        assert "Traceback" not in process.log(), process.log()[-3000:]


async def test_a_burst_across_two_api_processes_meets_the_limits_while_others_are_served(
    two_apis: list[str], fresh_db_url: str
) -> None:
    mallory = _headers("burst-" + uuid.uuid4().hex)
    others = [_headers("calm-" + uuid.uuid4().hex) for _ in range(3)]
    clients = [httpx.AsyncClient(base_url=url, timeout=60) for url in two_apis]
    gate = asyncio.Semaphore(32)

    async def post(n: int, headers: dict[str, str]) -> tuple[int, httpx.Response]:
        async with gate:
            client = clients[n % 2]
            return n % 2, await client.post("/scraps", json={"content": f"s{n}"}, headers=headers)

    try:
        burst = [asyncio.create_task(post(n, mallory)) for n in range(300)]
        calm = [asyncio.create_task(post(n, headers)) for n, headers in enumerate(others * 2)]
        done = await asyncio.gather(*burst)
        served = await asyncio.gather(*calm)
    finally:
        for client in clients:
            await client.aclose()

    outcomes = collections.Counter((r.status_code, r.json().get("code")) for _, r in done)
    accepted = outcomes[(202, None)]
    capped = outcomes[(429, "TOO_MANY_ACTIVE_JOBS")]
    limited = outcomes[(429, "RATE_LIMITED")]
    assert accepted + capped + limited == 300, outcomes
    # the active-job cap held: 2 jobs a scrap, nothing over the cap
    assert accepted == ACTIVE_CAP // 2, outcomes
    # the bucket is shared: both processes together let through one burst (plus the refill
    # of 1 a minute while the burst ran), not one burst each
    assert accepted + capped <= BURST + 2, outcomes
    assert limited >= 300 - BURST - 2
    refusals = [(process, r) for process, r in done if r.status_code == 429]
    assert {process for process, _ in refusals} == {0, 1}  # each process refused some
    for _, response in refusals:
        _rate_limited(response, response.json()["code"])
    # the other users were served normally at the same time
    assert [r.status_code for _, r in served] == [202] * len(served), [r.text for _, r in served]

    connection = await asyncpg.connect(plain_url(fresh_db_url))
    try:
        jobs = await connection.fetchval(
            "SELECT count(*) FROM async_jobs j JOIN users u ON u.id = j.user_id"
            " WHERE u.external_id LIKE 'burst-%'"
        )
    finally:
        await connection.close()
    assert jobs == ACTIVE_CAP
