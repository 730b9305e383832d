"""Adding a job's message to the outbox (in the caller's transaction): first registration,
retries, delayed redeliveries, rescued jobs. The relay publishes a row once it is due."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.admission import Priority
from san_common.jobs.envelope import JobMessage
from san_common.models import OutboxMessage
from san_common.tracing import current_trace_context

JOBS_EXCHANGE = "jobs"


class JobRef(Protocol):
    """What a job's message is made of: an `AsyncJob`, or a row a statement returned."""

    @property
    def job_id(self) -> uuid.UUID: ...
    @property
    def job_type(self) -> str: ...
    @property
    def target_id(self) -> uuid.UUID: ...
    @property
    def user_id(self) -> uuid.UUID: ...
    @property
    def attempt(self) -> int: ...


async def add_job_message(
    session: AsyncSession,
    job: JobRef,
    *,
    available_at: datetime | None = None,
    priority: Priority = Priority.INTERACTIVE,
) -> JobMessage:
    """A new message (new `message_id`) for `job`, published when `available_at` has come
    (now when None). The routing key is the job type; queues are bound by job type. The
    row carries the job's user and `priority`, which the relay admits by
    (jobs/admission.py); a retry's is interactive: its user was waiting already."""
    message = new_job_message(
        job_id=job.job_id,
        job_type=job.job_type,
        target_id=job.target_id,
        user_id=job.user_id,
        attempt=job.attempt,
    )
    values: dict[str, object] = {
        "message_id": message.message_id,
        "exchange": JOBS_EXCHANGE,
        "routing_key": job.job_type,
        "body": message.model_dump(mode="json"),
        "headers": {},
        "user_id": job.user_id,
        "priority": int(priority),
    }
    if available_at is not None:
        values["available_at"] = available_at
    await session.execute(insert(OutboxMessage).values(**values))
    return message


def new_job_message(
    *, job_id: uuid.UUID, job_type: str, target_id: uuid.UUID, user_id: uuid.UUID, attempt: int
) -> JobMessage:
    """A new message (new `message_id`) for a job, carrying the current trace context."""
    return JobMessage(
        message_id=uuid.uuid4(),
        job_id=job_id,
        job_type=job_type,
        target_id=target_id,
        user_id=user_id,
        attempt=attempt,
        created_at=datetime.now(UTC),
        **current_trace_context(),
    )
