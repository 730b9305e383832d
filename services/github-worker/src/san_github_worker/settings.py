from __future__ import annotations

from pydantic import Field, model_validator

from san_common.crypto import resolve_keys
from san_common.settings import ServiceSettings


class GithubWorkerSettings(ServiceSettings):
    service_name: str = "github-worker"
    github_api_url: str = "https://api.github.com"
    github_timeout_seconds: float = Field(default=30.0, gt=0)
    token_encryption_keys: str = Field(default="", repr=False)
    # GitHub asks integrators to avoid concurrent requests; a small pool is the point.
    worker_prefetch: int = Field(default=4, ge=1, le=100)
    worker_max_tries: int = Field(default=5, ge=1, le=20)
    worker_backoff_seconds: float = Field(default=1.0, ge=0)
    worker_lease_seconds: float = Field(default=300.0, gt=0)
    worker_drain_seconds: float = Field(default=30.0, ge=0)
    worker_rate_limit_waits: int = Field(default=5, ge=0, le=100)
    worker_max_retry_after_seconds: float = Field(default=900.0, ge=0)

    @model_validator(mode="after")
    def _token_keys(self) -> GithubWorkerSettings:
        resolved = resolve_keys(
            self.token_encryption_keys, san_env=self.san_env, data_dir=self.data_dir
        )
        object.__setattr__(self, "token_encryption_keys", resolved)
        return self
