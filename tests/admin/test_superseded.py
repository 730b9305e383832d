"""Retry respects history (issue 35, acceptance 5): a FAILED job that a newer job of its
target and type superseded — the failed sweep's follow-up, say — is never retried. Bulk
retry's preview counts such jobs apart and skips them with the reason, and the failed
sweep and an operator's retry never both produce work for one target, whichever comes
first, also when they meet at the same moment."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from san_api.admin.service import SUPERSEDED
from san_common.jobs import lifecycle
from san_common.jobs.registration import register_job, register_job_in_transaction
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_recovery.policy import Policy
from san_recovery.runner import RunStatus, run_sweep
from san_recovery.sweeps import Sweep
from tests.admin.support import Sessions, new_user, operator_headers
from tests.recovery.seed import Seed
from tests.waiting import eventually

OP = operator_headers()
CA = JobType.CARD_ANALYSIS
LEASE = timedelta(seconds=30)


async def _failed_job(sessions: Sessions, scrap_id: uuid.UUID, user_id: uuid.UUID) -> uuid.UUID:
    """A card analysis that ran and failed, the way a worker fails it."""
    job = await register_job(sessions, job_type=CA, target_id=scrap_id, user_id=user_id)
    async with sessions() as session, session.begin():
        claimed = await lifecycle.claim(session, job.job_id, "w-test", LEASE)
        assert claimed is not None
        assert await lifecycle.fail(
            session, job.job_id, claimed.tries, "CARD_ANALYSIS failed: boom", "failed"
        )
    return job.job_id


async def _run(sessions: Sessions, job_id: uuid.UUID) -> None:
    """A worker claims the job and completes it."""
    async with sessions() as session, session.begin():
        claimed = await lifecycle.claim(session, job_id, "w-test", LEASE)
        assert claimed is not None, f"job {job_id} is not claimable"
        assert await lifecycle.complete(session, job_id, claimed.tries)


async def _jobs_of(sessions: Sessions, user_id: uuid.UUID, status: str) -> list[uuid.UUID]:
    async with sessions() as session:
        return list(
            (
                await session.scalars(
                    select(AsyncJob.job_id).where(
                        AsyncJob.user_id == user_id, AsyncJob.status == status
                    )
                )
            ).all()
        )


async def test_bulk_retry_skips_what_the_failed_sweep_superseded(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    seed = Seed(sessions, datetime.now(UTC))
    scraps = [await seed.scrap(user_id) for _ in range(10)]
    for scrap in scraps[:6]:
        await _failed_job(sessions, scrap, user_id)
    # The failed sweep follows each of those six up with a new job; five of them run.
    report = await run_sweep(sessions, Sweep.FAILED, now=seed.now, policy=Policy())
    assert report.status == RunStatus.DONE and report.tally.total.registered == 6
    follow_ups = await _jobs_of(sessions, user_id, "PENDING")
    for job_id in follow_ups[:5]:
        await _run(sessions, job_id)
    # Four more fail after the sweep ran: nobody followed them up.
    for scrap in scraps[6:]:
        await _failed_job(sessions, scrap, user_id)

    body = {"action": "retry", "filter": {"status": ["FAILED"], "user": external}}
    preview = await api.post("/admin/api/jobs/bulk/preview", json=body, headers=OP)
    assert preview.status_code == 200, preview.text
    assert (preview.json()["count"], preview.json()["superseded"]) == (4, 6)
    assert preview.json()["skipped"] == {SUPERSEDED: 6}

    done = await api.post("/admin/api/jobs/bulk", json=body, headers=OP)
    assert done.status_code == 200, done.text
    assert (done.json()["count"], done.json()["superseded"]) == (4, 6)

    for job_id in await _jobs_of(sessions, user_id, "PENDING"):
        await _run(sessions, job_id)
    async with sessions() as session:
        completed = dict(
            (
                await session.execute(
                    select(AsyncJob.target_id, func.count())
                    .where(AsyncJob.user_id == user_id, AsyncJob.status == "COMPLETED")
                    .group_by(AsyncJob.target_id)
                )
            ).all()
        )
    assert completed == {scrap: 1 for scrap in scraps}, "a target ran twice, or not at all"

    # Retrying one superseded job by id is refused with the reason; nothing changes.
    [superseded, *_] = await _jobs_of(sessions, user_id, "FAILED")
    refused = await api.post(f"/admin/api/jobs/{superseded}/retry", headers=OP)
    assert refused.status_code == 409 and "superseded" in refused.json()["detail"]
    assert await _jobs_of(sessions, user_id, "PENDING") == []


async def _waiting_for_a_lock(sessions: Sessions, pid: int) -> bool:
    async with sessions() as session:
        return bool(
            await session.scalar(
                text("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            )
        )


async def _pid(session: AsyncSession) -> int:
    pid: int = await session.scalar(text("SELECT pg_backend_pid()"))  # type: ignore[assignment]
    return pid


async def _second_waits_for_first(
    sessions: Sessions,
    first: Callable[[AsyncSession], Awaitable[object]],
    second: Callable[[AsyncSession], Awaitable[object]],
) -> object:
    """`first` in a transaction held open until `second`, in a transaction of its own, is
    seen waiting on a lock; then `first` commits. Returns what `second` returned."""
    async with sessions() as held, held.begin():
        await first(held)
        pid: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def run_second() -> object:
            async with sessions() as other, other.begin():
                pid.set_result(await _pid(other))
                return await second(other)

        task = asyncio.create_task(run_second())
        waiting = await asyncio.wait_for(pid, 10)
        await eventually(
            lambda: _waiting_for_a_lock(sessions, waiting), within=10, what="the second to wait"
        )
        assert not task.done()
    return await asyncio.wait_for(task, 10)


async def test_an_operator_retry_and_the_failed_sweep_at_once_make_one_job(
    sessions: Sessions,
) -> None:
    user_id, _ = await new_user(sessions)
    seed = Seed(sessions, datetime.now(UTC))

    async def follow_up(session: AsyncSession, job_id: uuid.UUID, scrap: uuid.UUID) -> bool:
        async def register() -> None:
            await register_job_in_transaction(
                session, job_type=CA, target_id=scrap, user_id=user_id, attempt=2
            )

        return await lifecycle.follow_up(session, job_id, register)

    # The operator first: the sweep, waiting on the job's lock, then finds it PENDING.
    scrap = await seed.scrap(user_id)
    job = await _failed_job(sessions, scrap, user_id)
    followed = await _second_waits_for_first(
        sessions,
        lambda s: lifecycle.retry(s, [job]),
        lambda s: follow_up(s, job, scrap),
    )
    assert followed is False
    assert await _jobs_of(sessions, user_id, "PENDING") == [job]
    await _run(sessions, job)

    # The sweep first: the operator, waiting on the job's lock, then sees the follow-up.
    scrap = await seed.scrap(user_id)
    job = await _failed_job(sessions, scrap, user_id)
    retried = await _second_waits_for_first(
        sessions,
        lambda s: follow_up(s, job, scrap),
        lambda s: lifecycle.retry(s, [job]),
    )
    assert retried == []
    [follow] = await _jobs_of(sessions, user_id, "PENDING")
    assert follow != job
    await _run(sessions, follow)
    async with sessions() as session, session.begin():  # completed since: still superseded
        assert await lifecycle.retry(session, [job]) == []
