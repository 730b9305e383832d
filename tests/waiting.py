"""Waiting on conditions with a deadline, never for a fixed time (async tests).

Sync callers (services as OS processes) use `tests.procs.wait_until`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.models import AsyncJob

SETTLED = ("COMPLETED", "FAILED")


async def eventually(
    predicate: Callable[[], Awaitable[bool]],
    *,
    within: float = 30.0,
    what: str,
    interval: float = 0.05,
    context: Callable[[], str] | None = None,
) -> None:
    """Poll `predicate` until it is true; fail the test after `within` seconds, with
    `context()` (logs, the last value seen) appended to the message."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(
                f"timed out after {within}s waiting for {what}"
                + ("\n" + context() if context else "")
            )
        await asyncio.sleep(interval)


async def settled_job(
    sessions: async_sessionmaker[AsyncSession],
    job_id: uuid.UUID | str,
    *,
    within: float = 30.0,
) -> AsyncJob:
    """The `async_jobs` row once COMPLETED or FAILED, read with a fresh session each poll."""
    key = uuid.UUID(str(job_id))
    job: AsyncJob | None = None

    async def settled() -> bool:
        nonlocal job
        async with sessions() as session:
            job = await session.get(AsyncJob, key)
        assert job is not None, f"job {job_id} does not exist"
        return job.status in SETTLED

    await eventually(
        settled,
        within=within,
        what=f"job {job_id} to settle",
        context=lambda: f"job {job_id} still {job.status if job else None}",
    )
    assert job is not None
    return job


async def settled_job_via_api(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    job_id: str,
    *,
    within: float = 60.0,
    context: Callable[[], str] | None = None,
) -> dict[str, Any]:
    """`GET /async-jobs/{job_id}` once the job is COMPLETED or FAILED."""
    job: dict[str, Any] = {}

    async def settled() -> bool:
        nonlocal job
        response = await client.get(f"/async-jobs/{job_id}", headers=headers)
        assert response.status_code == 200, response.text
        job = response.json()
        return job["status"] in SETTLED

    await eventually(
        settled,
        within=within,
        what=f"job {job_id} to settle",
        interval=0.1,
        context=lambda: f"last seen: {job}" + ("\n" + context() if context else ""),
    )
    return job
