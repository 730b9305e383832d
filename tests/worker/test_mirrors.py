"""The mirrored status of a job's target row follows the job in every path the runtime
and the rescuer take (issue 9, acceptance 7): claim → PROCESSING, retry and release →
PENDING, lease lost (rescued) → PENDING, fail → FAILED, complete → COMPLETED. Written by
the runtime from the registry's `Mirror`, never by a handler."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import date, timedelta
from typing import Any, ClassVar

import pytest
from sqlalchemy import func, insert, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs import lifecycle
from san_common.jobs.lifecycle import TryOutcome
from san_common.jobs.registration import register_job
from san_common.jobs.repository import tries_of
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, DailySummary, User
from san_common.worker.store import Claim, SqlJobStore
from san_recovery.rescuer import LeaseRescuer

LEASE = timedelta(seconds=30)


class _Noop:
    job_type: ClassVar[str] = JobType.TIL_GENERATION

    async def load(self, session: AsyncSession, job: AsyncJob) -> None:
        return None

    async def run(self, job: AsyncJob, payload: None) -> None:
        return None

    async def store(self, session: AsyncSession, job: AsyncJob, result: None) -> None:
        return None


@pytest.fixture
async def db(fresh_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(fresh_db_url, pool_size=4)
    yield create_session_factory(engine)
    await engine.dispose()


async def _summary_status(sessions: async_sessionmaker[AsyncSession], summary_id: Any) -> str:
    async with sessions() as session:
        summary = await session.get(DailySummary, summary_id)
        assert summary is not None
        return summary.status


async def _claim(store: SqlJobStore, job_id: uuid.UUID) -> Claim:
    claim = await store.claim(job_id, "w-mirror", LEASE, reclaim_own=False)
    assert isinstance(claim, Claim), claim
    return claim


async def test_the_target_row_follows_its_job_through_every_path(
    db: async_sessionmaker[AsyncSession],
) -> None:
    async with db() as session, session.begin():
        user_id = await session.scalar(
            insert(User).values(external_id=f"m-{uuid.uuid4().hex}").returning(User.id)
        )
        summary_id = await session.scalar(
            insert(DailySummary)
            .values(user_id=user_id, target_date=date(2024, 1, 5))
            .returning(DailySummary.id)
        )
    assert user_id is not None and summary_id is not None
    job = await register_job(
        db, job_type=JobType.TIL_GENERATION, target_id=summary_id, user_id=user_id
    )
    store, handler = SqlJobStore(db), _Noop()
    status = lambda: _summary_status(db, summary_id)  # noqa: E731

    claim = await _claim(store, job.job_id)
    assert await status() == "PROCESSING"
    await store.retry(
        claim, delay=0, error="e", summary="s", outcome=TryOutcome.RETRY, checkpoint=None
    )
    assert await status() == "PENDING"  # waiting for its next try

    claim = await _claim(store, job.job_id)
    assert await status() == "PROCESSING"
    assert await store.release(claim, "released on shutdown")
    assert await status() == "PENDING"

    claim = await _claim(store, job.job_id)
    async with db() as session, session.begin():  # its worker vanished: the lease ran out
        await session.execute(
            update(AsyncJob)
            .where(AsyncJob.job_id == job.job_id)
            .values(lease_expires_at=func.now() - timedelta(seconds=1))
        )
    assert await LeaseRescuer(db, batch_size=10).rescue_once() == 1
    assert await status() == "PENDING"
    assert not await store.fail(claim, "late", "late")  # the lost try is fenced out
    assert await status() == "PENDING"

    claim = await _claim(store, job.job_id)
    assert await store.fail(claim, "TIL_GENERATION failed: x", "permanent failure")
    assert await status() == "FAILED"

    async with db() as session, session.begin():  # an operator's retry, same job id
        assert await lifecycle.retry(session, [job.job_id]) == [job.job_id]
    assert await status() == "PENDING"
    claim = await _claim(store, job.job_id)
    assert await store.finish(claim, handler, None)
    assert await status() == "COMPLETED"

    async with db() as session:
        outcomes = [(t.try_no, t.outcome) for t in await tries_of(session, job.job_id)]
    assert outcomes == [
        (1, "retry"),
        (2, "released"),
        (3, "lease_lost"),
        (4, "failed"),
        (5, "completed"),
    ]
