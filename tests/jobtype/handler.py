"""The test-only job type's handler: the words of its target's text, counted."""

from __future__ import annotations

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.errors import PermanentJobError
from san_common.models import AsyncJob
from san_common.worker import JobHandler, Write, handles
from tests.jobtype.spec import WORD_COUNT, WORD_COUNTS

_SET_WORDS = (
    update(WORD_COUNTS)
    .where(WORD_COUNTS.c.id == bindparam("target"))
    .values(words=bindparam("words"))
)


@handles(WORD_COUNT)
class WordCountHandler(JobHandler[str, int]):
    async def load(self, session: AsyncSession, job: AsyncJob) -> str:
        found = await session.scalar(
            select(WORD_COUNTS.c.text).where(WORD_COUNTS.c.id == job.target_id)
        )
        if found is None:
            raise PermanentJobError(f"word count {job.target_id} does not exist")
        return found

    async def run(self, job: AsyncJob, text: str) -> int:
        words = len(text.split())
        if not words:
            raise PermanentJobError("the text has no words")
        return words

    def write(self, job: AsyncJob, words: int) -> Write:
        return Write(_SET_WORDS, {"target": job.target_id, "words": words})
