"""The test-only job type's endpoint: the target row and its job, in the request's
transaction."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, status
from pydantic import BaseModel, Field
from sqlalchemy import insert

from san_api.deps import CurrentUser, SessionDep
from san_common.jobs.registration import register_job_in_transaction
from tests.jobtype.spec import WORD_COUNT, WORD_COUNTS

router = APIRouter()


class WordCountCreate(BaseModel):
    text: str = Field(max_length=10_000)


class WordCountAccepted(BaseModel):
    wordCountId: uuid.UUID
    jobId: uuid.UUID


@router.post("/word-counts", status_code=status.HTTP_202_ACCEPTED)
async def create_word_count(
    body: WordCountCreate, user: CurrentUser, session: SessionDep
) -> WordCountAccepted:
    target: uuid.UUID = await session.scalar(  # type: ignore[assignment]
        insert(WORD_COUNTS).values(user_id=user.user_id, text=body.text).returning(WORD_COUNTS.c.id)
    )
    job = await register_job_in_transaction(
        session, job_type=WORD_COUNT, target_id=target, user_id=user.user_id
    )
    return WordCountAccepted(wordCountId=target, jobId=job.job_id)
