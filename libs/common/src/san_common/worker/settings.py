"""Settings shared by the worker services (docs/reference/job-rules.md §2.5)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from sqlalchemy.ext.asyncio import AsyncEngine

from san_common import quotas
from san_common.db.engine import create_engine
from san_common.settings import ServiceSettings
from san_common.worker.executor import RuntimeConfig


class WorkerSettings(ServiceSettings):
    reported_prefixes: ClassVar[tuple[str, ...]] = ("WORKER_",)
    worker_prefetch: int = Field(default=10, ge=1, le=1000)
    worker_max_tries: int = Field(default=3, ge=1, le=20)
    worker_backoff_seconds: float = Field(default=1.0, ge=0)
    # Short, so a vanished worker's jobs are taken over in seconds; the heartbeat renews it
    # every third of it.
    worker_lease_seconds: float = Field(default=20.0, gt=0)
    worker_max_backoff_seconds: float = Field(default=300.0, ge=0)
    worker_drain_seconds: float = Field(default=30.0, ge=0)
    worker_rate_limit_waits: int = Field(default=5, ge=0, le=100)
    worker_max_retry_after_seconds: float = Field(default=900.0, ge=0)
    worker_held_results: int = Field(
        default=100,
        ge=0,
        le=10000,
        description="Results a worker holds in memory while PostgreSQL is unreachable, "
        "instead of giving their jobs back to be run (and the AI asked) again; 0 holds none",
    )
    worker_hold_seconds: float = Field(
        default=300.0,
        gt=0,
        le=1200,
        description="Longest a held result waits for PostgreSQL before its job is given back",
    )
    worker_database_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Longest wait on PostgreSQL for a connection, a connect or a statement",
    )

    upstream_quotas: bool = Field(
        default=True,
        description="Pace AI and GitHub calls by budgets every worker shares (off: only the "
        "upstream's 429 answers pace them)",
    )

    def quotas(self, engine: AsyncEngine) -> quotas.Quotas:
        return quotas.UpstreamQuotas(engine) if self.upstream_quotas else quotas.NoQuotas()

    def database_engine(self, pool_size: int) -> AsyncEngine:
        """The worker's engine (docs/hot-paths.md, "The engines"; docs/reliability.md,
        "Partitions"). A worker cut off from PostgreSQL without a reset fails its claims in
        time and takes the outage path — the delivery goes back to the broker for another
        worker — instead of holding it until TCP gives up; and the server ends a
        transaction the cut-off worker left open, whose row locks would stall that other
        worker (a worker's transactions wait on nothing but their own statements)."""
        timeout = self.worker_database_timeout_seconds
        return create_engine(
            self.database_url,
            pool_size=pool_size,
            pre_ping=False,
            generic_plans=True,
            timeout_seconds=timeout,
            idle_transaction_seconds=timeout,
        )

    def runtime_config(self) -> RuntimeConfig:
        return RuntimeConfig(
            prefetch=self.worker_prefetch,
            lease_seconds=self.worker_lease_seconds,
            max_tries=self.worker_max_tries,
            backoff_seconds=self.worker_backoff_seconds,
            max_backoff_seconds=self.worker_max_backoff_seconds,
            drain_seconds=self.worker_drain_seconds,
            rate_limit_waits=self.worker_rate_limit_waits,
            max_retry_after_seconds=self.worker_max_retry_after_seconds,
            held_results=self.worker_held_results,
            hold_seconds=self.worker_hold_seconds,
        )
