"""Registering a job: the `async_jobs` row and its outbox row, always in one transaction.

Two modes, as in the seed (SPEC §2.3):
- `register_job_in_transaction` joins the caller's open transaction (the seed's MANDATORY)
  and raises `TransactionRequired` if there is none;
- `register_job` opens and commits a transaction of its own (the seed's REQUIRES_NEW).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import metrics
from san_common.jobs import registry
from san_common.jobs.outbox import JOBS_EXCHANGE, add_job_message
from san_common.jobs.types import ACTIVE_STATUSES
from san_common.models import AsyncJob

__all__ = [
    "JOBS_EXCHANGE",
    "ActiveJobForUser",
    "DuplicateActiveJob",
    "RegisteredJob",
    "TransactionRequired",
    "lock_user",
    "register_job",
    "register_job_in_transaction",
]


class TransactionRequired(RuntimeError):
    """Job registration in the caller's transaction was asked for outside a transaction."""


class DuplicateActiveJob(Exception):
    """An active (PENDING or PROCESSING) job already exists for this target and type."""

    def __init__(self, job_type: str, target_id: uuid.UUID) -> None:
        super().__init__(f"an active {job_type} job already exists for target {target_id}")
        self.job_type = job_type
        self.target_id = target_id


class ActiveJobForUser(DuplicateActiveJob):
    """The job type allows one active job per user (its registry entry names a user lock),
    and the user has one: `job_id`."""

    def __init__(self, job_type: str, target_id: uuid.UUID, job_id: uuid.UUID) -> None:
        super().__init__(job_type, target_id)
        self.active_job_id = job_id


@dataclass(frozen=True)
class RegisteredJob:
    job_id: uuid.UUID
    job_type: str
    target_id: uuid.UUID
    message_id: uuid.UUID


async def register_job_in_transaction(
    session: AsyncSession,
    *,
    job_type: str,
    target_id: uuid.UUID,
    user_id: uuid.UUID,
    attempt: int = 1,
) -> RegisteredJob:
    """Add the job and its outbox message to the caller's open transaction.

    Raises `DuplicateActiveJob` when the partial unique index already holds an active job
    for (target, type). The conflict is resolved by `ON CONFLICT DO NOTHING`, so the
    caller's transaction stays usable either way.
    """
    if not session.in_transaction():
        raise TransactionRequired(
            "register_job_in_transaction needs an open transaction; use register_job instead"
        )
    spec = registry.spec_for(job_type)
    if spec.user_lock is not None:
        # The job type's per-user rule (one active TIL_GENERATION per user) needs every
        # registration for the user serialized; a caller that checked the rule under the
        # lock already holds it (advisory locks are re-entrant within a transaction).
        await lock_user(session, spec.user_lock, user_id)
        active = await session.scalar(
            select(AsyncJob.job_id)
            .where(
                AsyncJob.user_id == user_id,
                AsyncJob.job_type == str(job_type),
                AsyncJob.status.in_([s.value for s in ACTIVE_STATUSES]),
            )
            .limit(1)
        )
        if active is not None:
            raise ActiveJobForUser(job_type, target_id, active)
    job_id = uuid.uuid4()
    job = await session.scalar(
        insert(AsyncJob)
        .values(
            job_id=job_id,
            job_type=str(job_type),
            target_id=target_id,
            user_id=user_id,
            attempt=attempt,
        )
        .on_conflict_do_nothing(
            index_elements=["target_id", "job_type"],
            index_where=text("status IN ('PENDING', 'PROCESSING')"),
        )
        .returning(AsyncJob)
    )
    if job is None:
        raise DuplicateActiveJob(job_type, target_id)
    message = await add_job_message(session, job)
    # Counted when added to the transaction: a caller that rolls back afterwards (rare:
    # the caller's own later failure) is counted too.
    metrics.JOBS_REGISTERED.labels(str(job_type)).inc()
    return RegisteredJob(job_id, job_type, target_id, message.message_id)


async def register_job(
    session_factory: async_sessionmaker[AsyncSession],
    *,
    job_type: str,
    target_id: uuid.UUID,
    user_id: uuid.UUID,
    attempt: int = 1,
) -> RegisteredJob:
    """Register a job in a transaction of its own and commit it."""
    async with session_factory() as session, session.begin():
        return await register_job_in_transaction(
            session, job_type=job_type, target_id=target_id, user_id=user_id, attempt=attempt
        )


async def lock_user(session: AsyncSession, namespace: str, user_id: uuid.UUID) -> None:
    """Wait for, then hold until the end of the caller's transaction, the advisory lock
    `namespace` + user. Keys are 64-bit hashes: a collision only makes two users wait for
    each other."""
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
        {"key": f"{namespace}{user_id}"},
    )
