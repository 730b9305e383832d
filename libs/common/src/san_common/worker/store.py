"""The executor's port to the database: each method is one short transaction.

`SqlJobStore` is the real one; the unit tier gives the executor an in-memory store with
the same methods. Every write of a try is fenced (`jobs.repository`): the methods that
settle a try return False (or None) when the try no longer holds the job.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs import registry
from san_common.jobs import repository as jobs
from san_common.jobs.repository import JobState, TryOutcome
from san_common.jobs.types import JobStatus
from san_common.models import AsyncJob, AsyncJobTry
from san_common.worker.handler import JobHandler


@dataclass(frozen=True)
class Claim:
    """The try a worker holds: the job as claimed, the try's number (its fencing token),
    and how many earlier tries spent the retry budget or were rate-limit waits."""

    job: AsyncJob
    try_no: int
    spent: int = 0
    waits: int = 0


class JobStore(Protocol):
    async def claim(
        self, job_id: uuid.UUID, worker_id: str, lease: timedelta, *, reclaim_own: bool
    ) -> Claim | JobState | None:
        """The claim, else the job's state (why not), else None (unknown job)."""
        ...

    async def load(self, claim: Claim, handler: JobHandler[Any, Any]) -> Any: ...

    async def finish(self, claim: Claim, handler: JobHandler[Any, Any], result: Any) -> bool:
        """`handler.store` and COMPLETED in one transaction; False (rolled back) when the
        try no longer holds the job."""
        ...

    async def fail(self, claim: Claim, message: str, summary: str) -> bool: ...

    async def retry(
        self,
        claim: Claim,
        *,
        delay: float,
        error: str,
        summary: str,
        outcome: TryOutcome,
        checkpoint: dict[str, object] | None,
    ) -> datetime | None: ...

    async def release(self, claim: Claim, reason: str) -> bool: ...

    async def extend(self, claim: Claim, lease: timedelta) -> bool: ...

    async def defer(self, job_id: uuid.UUID, at: datetime) -> bool: ...


class _LeaseLost(Exception):
    """Raised inside `finish` to roll the handler's writes back."""


async def _mirror(
    session: AsyncSession, job: AsyncJob, status: JobStatus, error: str | None = None
) -> None:
    """The target row's mirrored status follows the job, in the job's own transaction."""
    spec = registry.find(job.job_type)
    if spec is not None and spec.mirror is not None:
        await spec.mirror.set(session, job.target_id, status.value, error)


class SqlJobStore:
    """The runtime's transactions; each also writes the mirrored status of the job's target
    row (registry `Mirror`), so no handler writes it."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def claim(
        self, job_id: uuid.UUID, worker_id: str, lease: timedelta, *, reclaim_own: bool
    ) -> Claim | JobState | None:
        async with self._sessions() as session, session.begin():
            job = await jobs.claim(session, job_id, worker_id, lease, reclaim_own=reclaim_own)
            if job is None:
                return await jobs.state(session, job_id)
            await _mirror(session, job, JobStatus.PROCESSING)
            spent, waits = (
                await session.execute(
                    select(
                        func.count().filter(AsyncJobTry.outcome.in_(jobs.SPENT_OUTCOMES)),
                        func.count().filter(AsyncJobTry.outcome == TryOutcome.RATE_LIMITED.value),
                    ).where(AsyncJobTry.job_id == job_id)
                )
            ).one()
            return Claim(job, job.tries, int(spent), int(waits))

    async def load(self, claim: Claim, handler: JobHandler[Any, Any]) -> Any:
        async with self._sessions() as session, session.begin():
            return await handler.load(session, claim.job)

    async def finish(self, claim: Claim, handler: JobHandler[Any, Any], result: Any) -> bool:
        try:
            async with self._sessions() as session, session.begin():
                await handler.store(session, claim.job, result)
                if not await jobs.complete(session, claim.job.job_id, claim.try_no):
                    raise _LeaseLost
                await _mirror(session, claim.job, JobStatus.COMPLETED)
        except _LeaseLost:
            return False
        return True

    async def fail(self, claim: Claim, message: str, summary: str) -> bool:
        async with self._sessions() as session, session.begin():
            if not await jobs.fail(session, claim.job.job_id, claim.try_no, message, summary):
                return False
            await _mirror(session, claim.job, JobStatus.FAILED, message)
            return True

    async def retry(
        self,
        claim: Claim,
        *,
        delay: float,
        error: str,
        summary: str,
        outcome: TryOutcome,
        checkpoint: dict[str, object] | None,
    ) -> datetime | None:
        async with self._sessions() as session, session.begin():
            if checkpoint is not None:
                await jobs.save_checkpoint(session, claim.job.job_id, claim.try_no, checkpoint)
            at = await jobs.retry_later(
                session,
                claim.job.job_id,
                claim.try_no,
                delay=timedelta(seconds=delay),
                error=error,
                summary=summary,
                outcome=outcome,
            )
            if at is not None:
                await _mirror(session, claim.job, JobStatus.PENDING)
            return at

    async def release(self, claim: Claim, reason: str) -> bool:
        async with self._sessions() as session, session.begin():
            if not await jobs.release(session, claim.job.job_id, claim.try_no, reason):
                return False
            await _mirror(session, claim.job, JobStatus.PENDING)
            return True

    async def extend(self, claim: Claim, lease: timedelta) -> bool:
        async with self._sessions() as session, session.begin():
            return await jobs.extend_lease(session, claim.job.job_id, claim.try_no, lease)

    async def defer(self, job_id: uuid.UUID, at: datetime) -> bool:
        async with self._sessions() as session, session.begin():
            return await jobs.schedule_message(session, job_id, at)
