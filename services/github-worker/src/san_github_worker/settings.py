from __future__ import annotations

from pydantic import Field

from san_common.github.settings import GithubAccessSettings
from san_common.worker.settings import WorkerSettings


class GithubWorkerSettings(WorkerSettings, GithubAccessSettings):
    service_name: str = "github-worker"
    # GitHub asks integrators to avoid concurrent requests; a small pool is the point.
    worker_prefetch: int = Field(default=4, ge=1, le=100)
    worker_max_tries: int = Field(default=5, ge=1, le=20)
