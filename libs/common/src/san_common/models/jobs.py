from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from san_common.errors import WAITING_FOR
from san_common.jobs.types import ACTIVE_STATUSES, JobStatus
from san_common.models.base import Base, created_at, updated_at

_ACTIVE = ", ".join(f"'{s.value}'" for s in ACTIVE_STATUSES)


class AsyncJob(Base):
    __tablename__ = "async_jobs"
    __table_args__ = (
        # docs/reference/job-rules.md §2.2: at most one active job per (target, type), enforced by
        # the database.
        Index(
            "uk_async_jobs_active_target_job_type",
            "target_id",
            "job_type",
            unique=True,
            postgresql_where=text(f"status IN ({_ACTIVE})"),
        ),
        Index("ix_async_jobs_status_updated_at", "status", "updated_at"),
        Index("ix_async_jobs_target_id_job_type_created_at", "target_id", "job_type", "created_at"),
        Index("ix_async_jobs_user_id_job_type_status", "user_id", "job_type", "status"),
        # the operator console's newest-first keyset pagination; retention's horizon scan
        Index("ix_async_jobs_created_at_job_id", "created_at", "job_id"),
        Index("ix_async_jobs_status_finished_at", "status", "finished_at"),
        # Rescuer: PROCESSING jobs by lease expiry.
        Index(
            "ix_async_jobs_lease_expires_at",
            "lease_expires_at",
            postgresql_where=text(f"status = '{JobStatus.PROCESSING.value}'"),
        ),
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s.value}'" for s in JobStatus) + ")", name="status"
        ),
        # The jobs waiting for each upstream quota (the scaling signal, the console).
        Index(
            "ix_async_jobs_waiting_for_waiting_key",
            "waiting_for",
            "waiting_key",
            postgresql_where=text(
                f"status = '{JobStatus.PENDING.value}' AND waiting_for IS NOT NULL"
            ),
        ),
        CheckConstraint(
            "waiting_for IN (" + ", ".join(f"'{w}'" for w in WAITING_FOR) + ")",
            name="waiting_for",
        ),
    )

    job_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    # One of the registry's job types (san_common.jobs.registry), checked at registration.
    job_type: Mapped[str] = mapped_column(Text)
    # Deliberately no foreign key: the target's table depends on job_type.
    target_id: Mapped[uuid.UUID]
    user_id: Mapped[uuid.UUID]
    status: Mapped[str] = mapped_column(Text, server_default=JobStatus.PENDING.value)
    error_message: Mapped[str | None] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer, server_default="1")
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A PROCESSING job belongs to `worker_id` until `lease_expires_at`; the worker
    # heartbeats while it runs, so an expired lease means the worker died.
    worker_id: Mapped[str | None] = mapped_column(Text)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Claims so far. It is the fencing token: every write of a try matches `tries = <the
    # try's number>`, so a worker whose try was taken over changes nothing.
    tries: Mapped[int] = mapped_column(Integer, server_default="0")
    # While a retry waits: the job is PENDING and its next message is due at this time.
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The latest try's error (full, redacted) and the sanitized summary shown to the owner.
    last_error: Mapped[str | None] = mapped_column(Text)
    error_summary: Mapped[str | None] = mapped_column(Text)
    # A handler's partial result kept across tries (JobHandler.checkpoint).
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # Why a PENDING job's next try waits until `next_attempt_at` (`errors.WAITING_FOR`),
    # and for an upstream quota, its key; set by the try that met the wait, cleared by the
    # next claim.
    waiting_for: Mapped[str | None] = mapped_column(Text)
    waiting_key: Mapped[str | None] = mapped_column(Text)


class AsyncJobTry(Base):
    """One row per try of a job: who ran it, when, and how it ended."""

    __tablename__ = "async_job_tries"

    job_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("async_jobs.job_id", ondelete="CASCADE"), primary_key=True
    )
    try_no: Mapped[int] = mapped_column(Integer, primary_key=True)
    worker_id: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = created_at()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # None while the try runs; then a `TryOutcome` value.
    outcome: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)


class AsyncJobTransition(Base):
    """The status changes `async_jobs` allows, one row per (from status, event): the
    database's copy of `jobs.lifecycle.TRANSITIONS`, which a trigger checks every UPDATE
    against (migration 0010)."""

    __tablename__ = "async_job_transitions"

    from_status: Mapped[str] = mapped_column(Text, primary_key=True)
    event: Mapped[str] = mapped_column(Text, primary_key=True)
    to_status: Mapped[str] = mapped_column(Text)


class OutboxMessage(Base):
    """A message committed together with the rows it announces; the relay publishes it."""

    __tablename__ = "outbox_messages"
    __table_args__ = (
        # the relay's claim: the unpublished rows in the order it takes them (0008)
        Index(
            "ix_outbox_messages_due",
            "available_at",
            "id",
            postgresql_where=text("published_at IS NULL"),
        ),
        # the relay's fair claim: (user, class, job type) groups and their earliest rows (0018)
        Index(
            "ix_outbox_messages_fair",
            "user_id",
            "priority",
            "routing_key",
            "id",
            postgresql_where=text("published_at IS NULL"),
        ),
        Index(
            "ix_outbox_messages_published_at",
            "published_at",
            postgresql_where=text("published_at IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    message_id: Mapped[uuid.UUID] = mapped_column(unique=True)
    exchange: Mapped[str] = mapped_column(Text)
    routing_key: Mapped[str] = mapped_column(Text)
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    headers: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = created_at()
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The relay publishes the row once this time has come (retries, delayed redeliveries).
    available_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    # Whose job it is (the nil UUID: nobody's) and its priority class (jobs/admission.py):
    # what the relay's fair claim orders by (migration 0018).
    user_id: Mapped[uuid.UUID] = mapped_column(
        server_default=text("'00000000-0000-0000-0000-000000000000'::uuid")
    )
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    # The API publishes the row itself after its commit; `available_at` is then its grace
    # (migration 0019).
    direct: Mapped[bool] = mapped_column(server_default=text("false"))


class OutboxBulkLane(Base):
    """Whose backlog a job queue's bulk lane holds: one user's at a time (migration 0020)."""

    __tablename__ = "outbox_bulk_lanes"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    user_id: Mapped[uuid.UUID | None] = mapped_column(nullable=True)
    taken_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
