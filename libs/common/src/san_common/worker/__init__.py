"""The worker runtime shared by ai-worker and github-worker."""

from san_common.worker.handler import JobHandler
from san_common.worker.runtime import RuntimeConfig, WorkerRuntime

__all__ = ["JobHandler", "RuntimeConfig", "WorkerRuntime"]
