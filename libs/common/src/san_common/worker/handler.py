from __future__ import annotations

from typing import Any, ClassVar, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import AsyncJob

P = TypeVar("P")
R = TypeVar("R")


class JobHandler(Protocol[P, R]):
    """One job type's work, split so the runtime can place the transactions:

    - `load` reads what the job needs (short transaction) and returns the payload `P`. A
      handler whose job row (the claim returns it) is all it needs keeps this class's
      `load`: the runtime then opens no transaction for it and `run` gets None;
    - `run` makes the external call(s) with **no** transaction open, returning `R`;
    - `store` writes the results in the transaction that marks the job COMPLETED.

    Raise `PermanentJobError` / `TransientJobError` (san_common.errors) to steer retries;
    any other exception from `run` fails the job with its cause chain. A failure may carry
    a `checkpoint` (a JSON object): the runtime keeps it on the job, and the next try finds
    it in `job.checkpoint` (card analysis keeps a successful chat answer this way).

    Handlers never write the job's status, nor the mirrored status of its target row: the
    runtime does, from the job type's registry entry (san_common.jobs.registry).
    """

    job_type: ClassVar[str]

    async def load(self, session: AsyncSession, job: AsyncJob) -> P:
        # Not abstract: a handler without a load of its own must still be instantiable.
        raise TypeError(f"{type(self).__name__} has no load; the runtime does not call it")

    async def run(self, job: AsyncJob, payload: P) -> R: ...

    async def store(self, session: AsyncSession, job: AsyncJob, result: R) -> None: ...


def needs_load(handler: JobHandler[Any, Any]) -> bool:
    """Whether `handler` reads anything beyond its job row (its class overrides `load`)."""
    return getattr(type(handler), "load", JobHandler.load) is not JobHandler.load
