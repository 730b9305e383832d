"""Retries never pay twice (issue 39, acceptance 5): when the embedding call fails after the
chat call answered, the retry reads the kept chat answer (the job's checkpoint) instead of
asking again, and the ledger counts the chat call once."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from sqlalchemy import select

from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AiUsage, Scrap, User
from tests.usage.conftest import System
from tests.waiting import settled_job

pytestmark = pytest.mark.rabbit


async def test_a_failed_embedding_retry_reuses_the_chat_answer_and_pays_it_once(
    system: System,
) -> None:
    content = f"Checkpoints keep paid answers {uuid.uuid4().hex}"
    async with system.sessions() as session, session.begin():
        user = User(external_id=f"checkpoint-{uuid.uuid4().hex}")
        session.add(user)
        await session.flush()
        digest = hashlib.sha256(content.encode()).hexdigest()
        scrap = Scrap(user_id=user.id, content=content, content_hash=digest)
        session.add(scrap)
    chats = system.ai.chat_calls("card_analysis")
    system.ai.set_fault("http_500", times=1, path="/v1/embeddings")
    job = await register_job(
        system.sessions, job_type=JobType.CARD_ANALYSIS, target_id=scrap.id, user_id=user.id
    )
    done = await settled_job(system.sessions, job.job_id)
    assert done.status == "COMPLETED", done.error_message
    assert done.tries == 2  # the embedding failed once
    assert system.ai.chat_calls("card_analysis") - chats == 1  # the retry asked no chat

    async with system.sessions() as session:
        rows = (
            await session.scalars(
                select(AiUsage).where(AiUsage.job_id == job.job_id).order_by(AiUsage.id)
            )
        ).all()
    # try 1: the chat (the failed embedding answered nothing); try 2: the embedding only
    assert [(r.try_no, r.call) for r in rows] == [(1, "chat"), (2, "embedding")]
    reported = system.ai.reported_usage
    assert sum(r.prompt_tokens for r in rows) == reported["prompt"]
    assert sum(r.completion_tokens for r in rows) == reported["completion"]
