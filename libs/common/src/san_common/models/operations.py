"""Tables of the operator tooling (docs/reference/job-rules.md §2.6, §2.6b): the audit log, the
job-event log that feeds `GET /async-jobs/{id}/events`, paused job types, and the recovery sweep
history."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Float, ForeignKey, Identity, Index, Integer, Text, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base, created_at


class AdminAudit(Base):
    """One row per operator action, written in the action's own transaction: no action
    commits without its row."""

    __tablename__ = "admin_audit"
    __table_args__ = (Index("ix_admin_audit_at", "at"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    at: Mapped[datetime] = created_at()
    actor: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)
    target: Mapped[str | None] = mapped_column(Text)
    filter: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    count: Mapped[int] = mapped_column(Integer, server_default="0")
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


class AsyncJobEvent(Base):
    """A job's status changes, appended by a trigger on `async_jobs` (migration 0003) that
    also NOTIFYs `san_job_events` with `<job_id>:<id>`. Per job, ids grow in commit order
    (the row lock serialises a job's updates), so `id` is a resumable SSE event id."""

    __tablename__ = "async_job_events"
    __table_args__ = (Index("ix_async_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("async_jobs.job_id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = created_at()


class JobTypePause(Base):
    """A paused job type: every worker stops consuming its queue while the row exists."""

    __tablename__ = "job_type_pauses"

    job_type: Mapped[str] = mapped_column(Text, primary_key=True)
    paused_by: Mapped[str] = mapped_column(Text)
    paused_at: Mapped[datetime] = created_at()


class WorkerPresence(Base):
    """A worker process, as it last reported itself: written by the process's presence
    beat (`san_common.worker.presence`), one statement per beat whatever it runs; removed
    when the process stops cleanly. A row whose beat went silent is a worker that died or
    was cut off; it is deleted after a day. What it runs is read from `async_jobs`."""

    __tablename__ = "worker_presence"

    worker_id: Mapped[str] = mapped_column(Text, primary_key=True)
    host: Mapped[str] = mapped_column(Text)
    pid: Mapped[int] = mapped_column(Integer)
    job_types: Mapped[list[str]] = mapped_column(ARRAY(Text))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # How often it beats: a worker silent for several beats is shown as gone.
    beat_seconds: Mapped[float] = mapped_column(Float)


class SweepRun(Base):
    """What one run of one recovery sweep did (history for operators)."""

    __tablename__ = "recovery_sweep_runs"
    __table_args__ = (Index("ix_recovery_sweep_runs_started_at", "started_at"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    sweep: Mapped[str] = mapped_column(Text)
    trigger: Mapped[str] = mapped_column(Text)  # schedule | cli | operator
    status: Mapped[str] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    batches: Mapped[int] = mapped_column(Integer, server_default="0")
    totals: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    error: Mapped[str | None] = mapped_column(Text)
    request_id: Mapped[int | None] = mapped_column(BigInteger)


class SweepRequest(Base):
    """An operator's "run now": the recovery service picks it up within seconds. The
    process running it beats `heartbeat_at`; an unfinished request whose heartbeat stopped
    is taken again, `attempts` being the taker's fencing token."""

    __tablename__ = "recovery_sweep_requests"
    __table_args__ = (
        Index(
            "ix_recovery_sweep_requests_unfinished",
            "id",
            postgresql_where=text("finished_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    sweeps: Mapped[list[str]] = mapped_column(ARRAY(Text))
    requested_by: Mapped[str] = mapped_column(Text)
    requested_at: Mapped[datetime] = created_at()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ok: Mapped[bool | None]
    error: Mapped[str | None] = mapped_column(Text)


# The recovery sweeps an operator may run (san_recovery.sweeps.Sweep; a test keeps the two
# in step): the API names them without importing the recovery service.
SWEEP_NAMES = ("ghost", "failed", "orphans", "unrefined", "daily-til", "retention")
