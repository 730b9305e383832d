"""The worker runtime shared by ai-worker and github-worker."""

from san_common.worker.executor import Executor, Outcome, RuntimeConfig
from san_common.worker.handler import JobHandler, Write, collect, handles
from san_common.worker.runtime import WorkerRuntime

__all__ = [
    "Executor",
    "JobHandler",
    "Outcome",
    "RuntimeConfig",
    "WorkerRuntime",
    "Write",
    "collect",
    "handles",
]
