from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from croniter import croniter
from pydantic import Field, field_validator
from sqlalchemy.ext.asyncio import AsyncEngine

from san_common.db.engine import create_engine
from san_common.settings import ServiceSettings
from san_recovery.policy import Policy


class RecoverySettings(ServiceSettings):
    """The maintenance service: the intervals of its tasks, the thresholds and schedules
    of the recovery sweeps; see docs/architecture.md ("Maintenance") and docs/recovery.md."""

    reported_prefixes: ClassVar[tuple[str, ...]] = ("RECOVERY_", "OUTBOX_")

    service_name: str = "recovery"
    recovery_schedule: str = Field(
        default="0 */2 * * *",
        description="Cron expression (UTC) of the ghost, failed, orphan and unrefined sweeps",
    )
    recovery_til_schedule: str = Field(
        default="10 0 * * *", description="Cron expression (UTC) of the daily TIL batch"
    )
    recovery_pending_timeout_minutes: float = Field(default=30.0, gt=0)
    recovery_processing_timeout_minutes: float = Field(default=60.0, gt=0)
    recovery_lease_grace_seconds: float = Field(
        default=60.0, ge=0, description="How long past its lease a PROCESSING job counts as a ghost"
    )
    recovery_orphan_grace_minutes: float = Field(default=10.0, ge=0)
    recovery_max_reregistrations: int = Field(
        default=3, ge=0, description="Retry cap: re-registrations per (target, job type)"
    )
    recovery_batch_size: int = Field(default=500, ge=1, le=10_000)
    recovery_til_lookback_days: int = Field(
        default=1, ge=1, le=31, description="Days before today the daily TIL batch looks at"
    )

    recovery_retention_completed_days: float = Field(
        default=14.0, gt=0, description="COMPLETED jobs are deleted this long after finishing"
    )
    recovery_retention_failed_days: float = Field(
        default=30.0, gt=0, description="FAILED and CANCELLED jobs: the same, kept longer"
    )
    recovery_request_poll_seconds: float = Field(
        default=2.0, gt=0, le=60, description="How often operators' 'run now' requests are read"
    )
    recovery_request_stale_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="A 'run now' request whose process stopped beating for this long is run again",
    )
    recovery_rescue_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often the lease rescuer looks for PROCESSING jobs whose lease expired",
    )
    recovery_rescue_batch_size: int = Field(default=500, ge=1, le=10_000)
    recovery_stranded_seconds: float = Field(
        default=10.0,
        gt=0,
        le=60,
        description="How often each job queue is checked for PENDING jobs without a message",
    )
    recovery_stranded_grace_seconds: float = Field(
        default=10.0,
        ge=1,
        le=300,
        description=(
            "How long a PENDING job waits for its delivery before the stranded check looks "
            "at it (the relay's lag; a re-published job waits this long again)"
        ),
    )
    recovery_runnable_seconds: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description=(
            "How often each job queue's runnable jobs are measured (san_queue_runnable_jobs, "
            "the workers' scaling signal)"
        ),
    )
    outbox_retention_hours: float = Field(
        default=24.0, ge=0, description="Published outbox rows are deleted after this"
    )
    outbox_cleanup_interval_seconds: float = Field(default=300.0, gt=0)
    recovery_request_state_cleanup_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="How often idle rate-limit buckets and spent OAuth states are deleted",
    )
    recovery_database_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Longest wait on PostgreSQL for a connection, a connect or a statement",
    )

    @field_validator("recovery_schedule", "recovery_til_schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        if not croniter.is_valid(value):
            raise ValueError(f"not a valid cron expression: {value!r}")
        return value

    def database_engine(self) -> AsyncEngine:
        """Every wait on the server bounded: a recovery service whose connections go
        silent (a partition, a failover that strands them) fails the sweep or the poll in
        hand and connects again, instead of waiting until TCP gives up — for a stranded
        connection, never — with no sweep run meanwhile. The server ends a transaction the
        service left open, whose row locks would stall the workers settling those jobs
        (a sweep's transactions wait on nothing but their own statements). Longer than
        the workers' bound: a sweep's statements scan more than one job."""
        timeout = self.recovery_database_timeout_seconds
        return create_engine(
            self.database_url,
            pool_size=3,
            timeout_seconds=timeout,
            idle_transaction_seconds=timeout,
        )

    def policy(self) -> Policy:
        return Policy(
            pending_after=timedelta(minutes=self.recovery_pending_timeout_minutes),
            processing_after=timedelta(minutes=self.recovery_processing_timeout_minutes),
            lease_grace=timedelta(seconds=self.recovery_lease_grace_seconds),
            orphan_grace=timedelta(minutes=self.recovery_orphan_grace_minutes),
            max_reregistrations=self.recovery_max_reregistrations,
            batch_size=self.recovery_batch_size,
            til_lookback_days=self.recovery_til_lookback_days,
            keep_completed=timedelta(days=self.recovery_retention_completed_days),
            keep_failed=timedelta(days=self.recovery_retention_failed_days),
        )
