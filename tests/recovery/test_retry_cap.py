"""A job that always fails — really run by the ai-worker runtime, fed by the relay over
RabbitMQ, against an AI server that always answers 400 — is re-registered at most 3 times
in total, then left FAILED; the orphan sweep does not resurrect it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers.card_analysis import CardAnalysisHandler
from san_common.broker.topology import Topology
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import RuntimeConfig
from san_recovery.policy import Policy
from san_recovery.runner import SweepReport, run_sweep
from san_recovery.sweeps import Sweep
from tests.fakes.fake_ai import FakeAiServer
from tests.recovery.seed import Seed
from tests.running import worker_and_relay
from tests.waiting import settled_job

pytestmark = pytest.mark.rabbit


@pytest.fixture
async def running_worker(
    db: async_sessionmaker[AsyncSession],
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fake_ai: FakeAiServer,
) -> AsyncIterator[None]:
    provider = build_provider("openai", base_url=fake_ai.base_url, api_key="k", timeout_seconds=5)
    fake_ai.set_fault("http_400")
    try:
        async with worker_and_relay(
            db,
            fresh_db_url,
            amqp_url,
            topology,
            {JobType.CARD_ANALYSIS: CardAnalysisHandler(provider)},
            RuntimeConfig(max_tries=1, lease_seconds=30),
        ):
            yield
    finally:
        fake_ai.set_fault(None)
        await provider.aclose()


async def chain(db: async_sessionmaker[AsyncSession], scrap_id: uuid.UUID) -> list[AsyncJob]:
    async with db() as session:
        jobs = await session.scalars(
            select(AsyncJob)
            .where(AsyncJob.target_id == scrap_id, AsyncJob.job_type == "CARD_ANALYSIS")
            .order_by(AsyncJob.attempt)
        )
        return list(jobs)


async def newest_settles(db: async_sessionmaker[AsyncSession], scrap_id: uuid.UUID) -> AsyncJob:
    """The chain's newest job once settled; only the test's own sweeps extend the chain."""
    newest = (await chain(db, scrap_id))[-1]
    return await settled_job(db, newest.job_id, within=20)


async def sweep(db: async_sessionmaker[AsyncSession], which: Sweep) -> SweepReport:
    return await run_sweep(db, which, now=datetime.now(UTC), policy=Policy())


@pytest.mark.usefixtures("running_worker")
async def test_always_failing_job_is_reregistered_three_times_then_left_failed(
    db: async_sessionmaker[AsyncSession], seed: Seed
) -> None:
    user = await seed.user()
    scrap = await seed.scrap(user)  # past the orphan grace period
    await register_job(db, job_type=JobType.CARD_ANALYSIS, target_id=scrap, user_id=user)

    for attempt in (1, 2, 3):
        failed = await newest_settles(db, scrap)
        assert (failed.status, failed.attempt) == ("FAILED", attempt), failed.error_message
        assert (await sweep(db, Sweep.FAILED)).tally.total.registered == 1

    last = await newest_settles(db, scrap)
    assert (last.status, last.attempt) == ("FAILED", 4)
    gave_up = await sweep(db, Sweep.FAILED)
    assert (gave_up.tally.total.registered, gave_up.tally.total.given_up) == (0, 1)
    assert (await sweep(db, Sweep.ORPHANS)).tally.total.found == 0
    assert (await sweep(db, Sweep.FAILED)).tally.total.found == 0

    jobs = await chain(db, scrap)
    assert [(j.attempt, j.status) for j in jobs] == [(n, "FAILED") for n in (1, 2, 3, 4)]
    assert (jobs[-1].error_message or "").startswith(
        "recovery gave up after 4 attempts: CARD_ANALYSIS failed: "
    )
