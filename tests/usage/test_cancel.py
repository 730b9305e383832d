"""Cancelling a running job (issue 39, acceptance 4): the owner's DELETE of a job whose AI
call is held reaches the worker running it within 2 s; the handler is stopped and its call
aborted (the fake AI sees the connection closed), the job ends CANCELLED with its try
closed `cancelled`, and no card is written. Another user's DELETE answers 404. A job type
that may not be stopped while it runs answers 409 NOT_CANCELLABLE and completes."""

from __future__ import annotations

import dataclasses
import hashlib
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import select, text

from san_common.jobs import registry
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, AsyncJobTry, KnowledgeCard, Scrap, User
from san_common.worker.cancels import APPLICATION_NAME
from tests.usage.conftest import System
from tests.waiting import eventually, settled_job_via_api

pytestmark = pytest.mark.rabbit

REACH_SECONDS = 2.0


@contextmanager
def not_cancellable_while_running(job_type: str) -> Iterator[None]:
    """The registry's spec of `job_type` made like the GitHub commit's, inside the block."""
    spec = registry.spec_for(job_type)
    registry.unregister(job_type)
    registry.register(dataclasses.replace(spec, cancellable_while_running=False))
    try:
        yield
    finally:
        registry.unregister(job_type)
        registry.register(spec)


async def _held_scrap(system: System, owner: str) -> tuple[uuid.UUID, str]:
    """A scrap of `owner` whose analysis runs, its AI call held: (scrap id, job id)."""
    content = f"cancel me {uuid.uuid4().hex}"
    before = system.ai.chat_calls("card_analysis")  # the fake AI serves the whole session
    async with system.sessions() as session, session.begin():
        user = User(external_id=owner)
        session.add(user)
        await session.flush()
        scrap = Scrap(
            user_id=user.id,
            content=content,
            content_hash=hashlib.sha256(content.encode()).hexdigest(),
        )
        session.add(scrap)
    job = await register_job(
        system.sessions, job_type=JobType.CARD_ANALYSIS, target_id=scrap.id, user_id=user.id
    )

    async def held() -> bool:
        return system.ai.chat_calls("card_analysis") > before

    await eventually(held, within=15, what="the analysis's AI call to be held")
    return scrap.id, str(job.job_id)


async def test_the_owner_cancels_a_running_job_and_its_worker_stops_within_2_s(
    system: System,
) -> None:
    await _cancel_and_check(system)


async def test_after_its_listen_connection_is_killed_the_worker_hears_cancels_again(
    system: System,
) -> None:
    listener = system.worker.cancels
    await eventually(_listening(system), within=10, what="the worker to listen for cancels")
    async with system.sessions() as session, session.begin():
        killed = await session.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = :name"
            ),
            {"name": APPLICATION_NAME},
        )
    assert killed == 1

    async def lost() -> bool:
        return not listener.listening.is_set()

    await eventually(lost, within=5, what="the worker to notice its LISTEN connection gone")
    await _cancel_and_check(system)


def _listening(system: System) -> Callable[[], Awaitable[bool]]:
    async def listening() -> bool:
        return system.worker.cancels.listening.is_set()

    return listening


async def _cancel_and_check(system: System) -> None:
    """The owner cancels a job whose AI call is held for 20 s: the call is aborted within
    2 s, the job ends CANCELLED with its one try `cancelled`, no card; a stranger's DELETE
    is a 404."""
    system.ai.delay_seconds = 20
    system.ai.set_fault("hang", times=1)
    await eventually(_listening(system), within=10, what="the worker to listen for cancels")
    subject = f"owner-{uuid.uuid4().hex}"
    owner = system.headers(subject)
    scrap_id, job_id = await _held_scrap(system, subject)
    calls = system.ai.chat_calls("card_analysis")

    stranger = system.headers(f"stranger-{uuid.uuid4().hex}")
    refused = await system.api.delete(f"/async-jobs/{job_id}", headers=stranger)
    assert refused.status_code == 404, refused.text

    asked = time.monotonic()
    answer = await system.api.delete(f"/async-jobs/{job_id}", headers=owner)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "CANCELLED"

    async def aborted() -> bool:
        return system.ai.closed_early == 1

    await eventually(aborted, within=REACH_SECONDS, what="the fake AI to see the call aborted")
    took = time.monotonic() - asked
    assert took < REACH_SECONDS, took

    async def stopped() -> bool:
        return not system.worker.executor.running(uuid.UUID(job_id))

    await eventually(stopped, within=REACH_SECONDS, what="the worker to let go of the job")
    async with system.sessions() as session:
        job = await session.get(AsyncJob, uuid.UUID(job_id))
        tries = (
            await session.scalars(select(AsyncJobTry).where(AsyncJobTry.job_id == job.job_id))
        ).all()
        card = await session.scalar(select(KnowledgeCard).where(KnowledgeCard.scrap_id == scrap_id))
    assert job is not None and job.status == "CANCELLED"
    assert [(t.try_no, t.outcome) for t in tries] == [(1, "cancelled")]
    assert tries[0].finished_at is not None
    assert card is None
    assert system.ai.chat_calls("card_analysis") == calls  # not retried


async def test_a_running_job_that_may_not_be_stopped_answers_409_and_completes(
    system: System,
) -> None:
    system.ai.delay_seconds = 2
    system.ai.set_fault("hang", times=1)
    subject = f"owner-{uuid.uuid4().hex}"
    owner = system.headers(subject)
    with not_cancellable_while_running(JobType.CARD_ANALYSIS):
        _, job_id = await _held_scrap(system, subject)
        answer = await system.api.delete(f"/async-jobs/{job_id}", headers=owner)
        assert answer.status_code == 409, answer.text
        assert answer.json()["code"] == "NOT_CANCELLABLE"
        done = await settled_job_via_api(system.api, owner, job_id)
    assert done["status"] == "COMPLETED"
