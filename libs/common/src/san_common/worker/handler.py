from __future__ import annotations

from typing import Any, ClassVar, Protocol

from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.types import JobType
from san_common.models import AsyncJob


class JobHandler(Protocol):
    """One job type's work, split so the runtime can place the transactions:

    - `load` reads what the job needs (short transaction);
    - `run` makes the external call(s) with **no** transaction open, and may be retried;
    - `store` writes the results in the same transaction that marks the job COMPLETED.

    Raise `PermanentJobError` / `TransientJobError` (san_common.errors) to steer retries;
    any other exception fails the job with its cause chain.

    Optionally, a handler defines `on_failure(session, job, reason)` (see `FailureHook`):
    the runtime calls it in the transaction that marks the job FAILED, to fail the job's
    domain row too.
    """

    job_type: ClassVar[JobType]

    async def load(self, session: AsyncSession, job: AsyncJob) -> Any: ...

    async def run(self, job: AsyncJob, payload: Any) -> Any: ...

    async def store(self, session: AsyncSession, job: AsyncJob, result: Any) -> None: ...


class FailureHook(Protocol):
    """`handler.on_failure`: mark the job's domain row failed. Not called when the job was
    taken over by another worker (its lease expired), since that worker now owns the row."""

    async def __call__(self, session: AsyncSession, job: AsyncJob, reason: str) -> None: ...
