"""Registering a job: the `async_jobs` row and its outbox row, always in one transaction.

Two modes, as in the seed (SPEC §2.3):
- `register_job_in_transaction` joins the caller's open transaction (the seed's MANDATORY)
  and raises `TransactionRequired` if there is none;
- `register_job` opens and commits a transaction of its own (the seed's REQUIRES_NEW).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import metrics
from san_common.jobs.envelope import JobMessage
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, OutboxMessage
from san_common.tracing import current_trace_context

JOBS_EXCHANGE = "jobs"


class TransactionRequired(RuntimeError):
    """Job registration in the caller's transaction was asked for outside a transaction."""


class DuplicateActiveJob(Exception):
    """An active (PENDING or PROCESSING) job already exists for this target and type."""

    def __init__(self, job_type: JobType, target_id: uuid.UUID) -> None:
        super().__init__(f"an active {job_type} job already exists for target {target_id}")
        self.job_type = job_type
        self.target_id = target_id


@dataclass(frozen=True)
class RegisteredJob:
    job_id: uuid.UUID
    job_type: JobType
    target_id: uuid.UUID
    message_id: uuid.UUID


async def register_job_in_transaction(
    session: AsyncSession,
    *,
    job_type: JobType,
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
    job_id = uuid.uuid4()
    inserted = await session.scalar(
        insert(AsyncJob)
        .values(
            job_id=job_id,
            job_type=job_type.value,
            target_id=target_id,
            user_id=user_id,
            attempt=attempt,
        )
        .on_conflict_do_nothing(
            index_elements=["target_id", "job_type"],
            index_where=text("status IN ('PENDING', 'PROCESSING')"),
        )
        .returning(AsyncJob.job_id)
    )
    if inserted is None:
        raise DuplicateActiveJob(job_type, target_id)

    message = JobMessage(
        message_id=uuid.uuid4(),
        job_id=job_id,
        job_type=job_type,
        target_id=target_id,
        user_id=user_id,
        attempt=attempt,
        created_at=datetime.now(UTC),
        **current_trace_context(),
    )
    await session.execute(
        insert(OutboxMessage).values(
            message_id=message.message_id,
            exchange=JOBS_EXCHANGE,
            routing_key=job_type.value,
            body=message.model_dump(mode="json"),
            headers={},
        )
    )
    # Counted when added to the transaction: a caller that rolls back afterwards (rare:
    # the caller's own later failure) is counted too.
    metrics.JOBS_REGISTERED.labels(job_type.value).inc()
    return RegisteredJob(job_id, job_type, target_id, message.message_id)


async def register_job(
    session_factory: async_sessionmaker[AsyncSession],
    *,
    job_type: JobType,
    target_id: uuid.UUID,
    user_id: uuid.UUID,
    attempt: int = 1,
) -> RegisteredJob:
    """Register a job in a transaction of its own and commit it."""
    async with session_factory() as session, session.begin():
        return await register_job_in_transaction(
            session, job_type=job_type, target_id=target_id, user_id=user_id, attempt=attempt
        )
