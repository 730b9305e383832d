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
    """

    job_type: ClassVar[JobType]

    async def load(self, session: AsyncSession, job: AsyncJob) -> Any: ...

    async def run(self, job: AsyncJob, payload: Any) -> Any: ...

    async def store(self, session: AsyncSession, job: AsyncJob, result: Any) -> None: ...
