"""The scaling signal (services/recovery/src/san_recovery/runnable.py) against real
PostgreSQL and RabbitMQ: every job a worker could run now is counted wherever it is — due in
the outbox, ready in the queue, running — and a job waiting for an upstream quota is not,
neither before its reset nor, beyond the quota's room, after it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from san_common.broker.depths import QueueDepths
from san_common.broker.topology import Topology
from san_common.db.engine import bound_engine
from san_common.jobs import lifecycle
from san_common.jobs.lifecycle import TryOutcome
from san_common.jobs.types import JobType
from san_common.quotas import QuotaWait, Static, UpstreamQuotas
from san_recovery.runnable import Runnable, RunnableGauge
from tests.relay.conftest import drain_queue, publish_all, register_many
from tests.waiting import eventually

pytestmark = [pytest.mark.rabbit, pytest.mark.timeout(60)]

KEY = "ai http://fake/v1 model"
LEASE = timedelta(seconds=30)


async def measured(gauge: RunnableGauge, queue: str) -> Runnable:
    [one] = [m for m in await gauge.run_once() if m.queue == queue]
    exported = REGISTRY.get_sample_value("san_queue_runnable_jobs", {"queue": queue})
    assert exported == one.runnable
    return one


async def claim(sessions: async_sessionmaker[AsyncSession], job_ids: set[uuid.UUID]) -> None:
    async with sessions() as session, session.begin():
        connection = await session.connection()
        got = await lifecycle.claim_batch(connection, list(job_ids), "worker-1", LEASE)
    assert all(isinstance(c, lifecycle.Claimed) for c in got.values())


async def wait_for_quota(
    sessions: async_sessionmaker[AsyncSession], job_id: uuid.UUID, refused: QuotaWait
) -> None:
    """What the executor does with a try the quota refused (its first: `tries` is 1)."""
    async with sessions() as session, session.begin():
        at = await lifecycle.retry_later(
            session,
            job_id,
            1,
            delay=timedelta(seconds=refused.retry_after or 0),
            error=str(refused),
            summary="waiting for the upstream quota",
            outcome=TryOutcome.RATE_LIMITED,
            waiting_for=refused.waiting_for,
            waiting_key=refused.key,
        )
    assert at is not None


async def spent_quota(engine: AsyncEngine, window: float) -> QuotaWait:
    """A quota of one request a window, spent: the refusal a next call meets."""
    quotas = UpstreamQuotas(engine, window_seconds=window)
    await quotas.reserve(KEY, 0, Static(requests=1))
    with pytest.raises(QuotaWait) as refused:
        await quotas.reserve(KEY, 0, Static(requests=1))
    return refused.value


async def test_runnable_work_is_counted_wherever_it_is_and_quota_waits_are_not(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    sessions = fresh_sessions
    gauge = RunnableGauge(sessions, depths, topology)
    queue = topology.queue_name(JobType.CARD_ANALYSIS)
    job_ids = await register_many(sessions, 5, JobType.CARD_ANALYSIS)

    due = await measured(gauge, queue)
    assert (due.due, due.ready, due.runnable) == (5, 0, 5)

    await publish_all(fresh_db_url, amqp_url, topology, sessions)

    async def all_ready() -> bool:  # the broker's count follows its confirms shortly after
        return (await measured(gauge, queue)).ready == 5

    await eventually(all_ready, within=10, what="the five messages ready in the queue")
    ready = await measured(gauge, queue)
    assert (ready.due, ready.ready, ready.runnable) == (0, 5, 5)

    # The workers take every message; the jobs run.
    assert len(await drain_queue(amqp_url, queue)) == 5
    await claim(sessions, job_ids)
    running = await measured(gauge, queue)
    assert (running.ready, running.running, running.runnable) == (0, 5, 5)

    # Three calls are refused by a spent quota: those jobs wait for its reset, and only the
    # two still running are runnable.
    refused = await spent_quota(bound_engine(sessions), window=60)
    assert refused.waiting_for == "upstream-quota" and refused.key == KEY
    waiting = sorted(job_ids)[:3]
    for job_id in waiting:
        await wait_for_quota(sessions, job_id, refused)
    held = await measured(gauge, queue)
    assert (held.running, held.waiting, held.runnable) == (2, 3, 2)
    assert REGISTRY.get_sample_value("san_queue_waiting_jobs", {"queue": queue}) == 3


async def test_at_the_reset_only_as_many_waiting_jobs_as_the_quota_admits_count(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fresh_sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
) -> None:
    sessions = fresh_sessions
    gauge = RunnableGauge(sessions, depths, topology)
    queue = topology.queue_name(JobType.SCRAP_REFINE)
    job_ids = await register_many(sessions, 4, JobType.SCRAP_REFINE)
    await publish_all(fresh_db_url, amqp_url, topology, sessions)
    assert len(await drain_queue(amqp_url, queue)) == 4
    await claim(sessions, job_ids)
    refused = await spent_quota(bound_engine(sessions), window=1.0)
    for job_id in job_ids:
        await wait_for_quota(sessions, job_id, refused)
    before = await measured(gauge, queue)
    assert (before.due, before.waiting, before.runnable) == (0, 4, 0)

    await asyncio.sleep((refused.retry_after or 0) + 0.2)  # the reset is what is under test
    # All four are due again, and the window that opened has room for one call.
    after = await measured(gauge, queue)
    assert (after.due, after.waiting, after.beyond_quota, after.runnable) == (4, 0, 3, 1)
