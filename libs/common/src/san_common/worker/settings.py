"""Settings shared by the worker services (SPEC §2.5)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

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
        )
