"""SCRAP_REFINE: the AI rewrites the scrap into clean text, stored on the scrap
(docs/reference/job-rules.md §3.1)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from san_ai_worker import repository
from san_ai_worker.ai.provider import AiProvider
from san_common.errors import PermanentJobError
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, Write, handles


@handles(JobType.SCRAP_REFINE)
class ScrapRefineHandler(JobHandler[str, str]):
    def __init__(self, ai: AiProvider) -> None:
        self._ai = ai

    async def load(self, session: AsyncSession, job: AsyncJob) -> str:
        scrap = await repository.get_scrap(session, job.target_id)
        if scrap is None:
            raise PermanentJobError(f"scrap {job.target_id} does not exist")
        return scrap.content

    async def run(self, job: AsyncJob, content: str) -> str:
        return (await self._ai.refine_scrap(content)).refinedContent

    def write(self, job: AsyncJob, refined: str) -> Write:
        return repository.refined_content(job.target_id, refined)
