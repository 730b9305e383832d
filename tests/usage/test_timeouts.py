"""Per-job-type timeouts (issue 39, acceptance 3): at the JobSpec's deadline the handler is
cancelled and its AI call aborted (the server sees the connection closed), the try ends
`timed_out`, spending a try, and the retry completes once the AI answers again."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from sqlalchemy import select

from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJobTry, KnowledgeCard, Scrap, User
from tests.usage.conftest import System, job_timeout
from tests.waiting import eventually, settled_job

pytestmark = pytest.mark.rabbit

TIMEOUT = 2.0


async def new_scrap(system: System, content: str) -> Scrap:
    async with system.sessions() as session, session.begin():
        user = User(external_id=f"timeout-{uuid.uuid4().hex}")
        session.add(user)
        await session.flush()
        scrap = Scrap(
            user_id=user.id,
            content=content,
            content_hash=hashlib.sha256(content.encode()).hexdigest(),
        )
        session.add(scrap)
    return scrap


async def test_a_hung_ai_call_times_out_at_the_deadline_and_the_retry_completes(
    system: System,
) -> None:
    system.ai.delay_seconds = 30
    system.ai.set_fault("hang", times=1)  # the fake is "fixed" after the one hung call
    scrap = await new_scrap(system, f"Timeouts cancel the handler {uuid.uuid4().hex}")
    with job_timeout(JobType.CARD_ANALYSIS, TIMEOUT):
        job = await register_job(
            system.sessions,
            job_type=JobType.CARD_ANALYSIS,
            target_id=scrap.id,
            user_id=scrap.user_id,
        )
        done = await settled_job(system.sessions, job.job_id, within=30)
    assert done.status == "COMPLETED", done.error_message
    assert done.tries == 2
    async with system.sessions() as session:
        tries = (
            await session.scalars(
                select(AsyncJobTry)
                .where(AsyncJobTry.job_id == job.job_id)
                .order_by(AsyncJobTry.try_no)
            )
        ).all()
        card = await session.scalar(select(KnowledgeCard).where(KnowledgeCard.scrap_id == scrap.id))
    first, second = tries
    assert first.outcome == "timed_out", first.error
    assert first.finished_at is not None
    took = (first.finished_at - first.started_at).total_seconds()
    assert TIMEOUT <= took < TIMEOUT + 1, took
    assert "timed out after 2 s" in (first.error or "")
    assert second.outcome == "completed"
    assert card is not None

    async def closed() -> bool:
        return system.ai.closed_early == 1

    # The hung call was aborted, not left to run out its 30 s.
    await eventually(closed, within=2, what="the fake AI to see its connection closed")
