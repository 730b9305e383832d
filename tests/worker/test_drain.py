"""A worker told to stop starts nothing new. A worker of several queues holds up to a
prefetch of deliveries from each, more than it runs at once; one still waiting for a slot
when the drain begins goes straight back to its queue, for another worker, instead of
starting in the drain window (where it could be cut off by the drain's end)."""

from __future__ import annotations

import asyncio
import uuid
from typing import ClassVar

import aio_pika
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, RuntimeConfig, WorkerRuntime
from san_relay.relay import Relay
from san_relay.settings import RelaySettings
from tests.faults.harness import seed
from tests.waiting import eventually

pytestmark = pytest.mark.rabbit


class Gated(JobHandler[None, str]):
    """Runs until `gate` opens; writes nothing."""

    job_type: ClassVar[str] = JobType.SCRAP_REFINE

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.started: list[str] = []

    async def run(self, job: AsyncJob, payload: None) -> str:
        self.started.append(job.job_type)
        await self.gate.wait()
        return "done"

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        return None


async def _ready(amqp_url: str, queue_name: str) -> int:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(queue_name, passive=True)
        return queue.declaration_result.message_count or 0


async def _job(
    sessions: async_sessionmaker[AsyncSession], job_type: JobType, job_ids: list[uuid.UUID]
) -> AsyncJob:
    async with sessions() as session:
        for job_id in job_ids:
            job = await session.get(AsyncJob, job_id)
            if job is not None and job.job_type == job_type:
                return job
    raise AssertionError(f"no {job_type} job")


async def test_a_delivery_waiting_for_a_slot_when_the_drain_begins_is_requeued_not_run(
    fresh_sessions: async_sessionmaker[AsyncSession],
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
) -> None:
    gate = asyncio.Event()
    handler = Gated(gate)
    kinds = (JobType.SCRAP_REFINE, JobType.CARD_ANALYSIS)
    # one job at a time in the process, one delivery held from each of the two queues
    runtime = WorkerRuntime(
        session_factory=fresh_sessions,
        amqp_url=amqp_url,
        topology=topology,
        handlers={kind: handler for kind in kinds},
        config=RuntimeConfig(prefetch=1, lease_seconds=30, drain_seconds=30),
    )
    relay = Relay(
        RelaySettings(database_url=fresh_db_url, amqp_url=amqp_url, amqp_prefix=topology.prefix),
        fresh_sessions,
        topology,
    )
    stop, relay_stop = asyncio.Event(), asyncio.Event()
    working = asyncio.create_task(runtime.run(stop))
    relaying = asyncio.create_task(relay.run(relay_stop))
    try:
        await asyncio.wait_for(runtime.connected.wait(), 20)
        seeded = await seed(fresh_sessions, 1, kinds, label="drain")

        async def both_delivered() -> bool:
            counts = [await _ready(amqp_url, topology.queue_name(k)) for k in kinds]
            return len(handler.started) == 1 and counts == [0, 0]

        await eventually(both_delivered, what="one job running, the other's delivery held")
        (running,) = handler.started
        waiting = next(k for k in kinds if k != running)

        async def draining() -> bool:
            return not runtime.consuming()

        stop.set()
        await eventually(draining, what="the worker to begin its drain")
        gate.set()  # the running job ends: its slot frees while the drain runs
        await asyncio.wait_for(working, 30)
    finally:
        stop.set()
        relay_stop.set()
        gate.set()
        await asyncio.gather(working, relaying, return_exceptions=True)

    assert handler.started == [running]  # the held delivery never started
    assert (await _job(fresh_sessions, JobType(running), seeded.job_ids)).status == "COMPLETED"
    held = await _job(fresh_sessions, JobType(waiting), seeded.job_ids)
    assert (held.status, held.tries) == ("PENDING", 0)
    assert await _ready(amqp_url, topology.queue_name(waiting)) == 1
