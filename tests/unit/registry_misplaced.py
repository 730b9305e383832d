"""A handler module that marks a github-worker type (test_registry collects it as the
ai-worker's, which must refuse it)."""

from __future__ import annotations

from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, handles


@handles(JobType.TIL_GITHUB_COMMIT)
class MisplacedHandler(JobHandler[None, None]):
    async def run(self, job: AsyncJob, payload: None) -> None:
        return None
