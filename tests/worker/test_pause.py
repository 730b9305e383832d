"""Acceptance 4: pausing a job type stops its consumers in every worker (two runtimes, each
with its own broker connection, as two replicas would) within 5 s; resuming restarts them;
the jobs registered meanwhile wait in the queue and all complete — no message is lost."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator

import aio_pika
import httpx
import pytest

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, Scrap
from san_common.worker import WorkerRuntime
from san_common.worker.settings import WorkerSettings
from tests.admin.support import Sessions, new_user, operator_headers
from tests.api.support import api_with
from tests.conftest import api_settings
from tests.fakes.fake_ai import FakeAiServer
from tests.running import FAST, worker_and_relay
from tests.tcp_proxy import TcpProxy
from tests.waiting import eventually, settled_job

pytestmark = pytest.mark.rabbit

OP = operator_headers("pause-operator")
PAUSE_WITHIN = 5.0  # the acceptance bound (consumers poll the pauses every second)


async def counts(amqp_url: str, queue_name: str) -> tuple[int, int]:
    """(consumers, messages ready) of a queue."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(queue_name, passive=True)
        result = queue.declaration_result
        return result.consumer_count or 0, result.message_count or 0


@pytest.fixture
async def sessions_(fresh_db_url: str) -> AsyncIterator[Sessions]:
    engine = create_engine(fresh_db_url, pool_size=10)
    yield create_session_factory(engine)
    await engine.dispose()


async def test_pause_stops_every_consumer_and_resume_loses_nothing(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fake_ai: FakeAiServer,
    sessions_: Sessions,
) -> None:
    sessions = sessions_
    provider = build_provider(
        "openai", base_url=fake_ai.base_url, api_key="sk-test-key-123456", timeout_seconds=2
    )
    handlers = build_handlers(provider)
    queue = topology.queue_name(JobType.CARD_ANALYSIS)
    second = WorkerRuntime(
        session_factory=sessions,
        amqp_url=amqp_url,
        topology=topology,
        handlers=handlers,
        config=FAST,
    )
    stop = asyncio.Event()
    settings = api_settings(fresh_db_url, amqp_url, amqp_prefix=topology.prefix)
    try:
        async with (
            worker_and_relay(sessions, fresh_db_url, amqp_url, topology, handlers),
            api_with(settings) as admin,
        ):
            task = asyncio.create_task(second.run(stop))
            await asyncio.wait_for(second.connected.wait(), 20)
            assert (await counts(amqp_url, queue))[0] == 2

            await pause(admin, "pause")
            await eventually(
                lambda: consumers_are(amqp_url, queue, 0),
                within=PAUSE_WITHIN,
                what="both workers to stop consuming CARD_ANALYSIS",
            )
            user_id, _ = await new_user(sessions)
            jobs = [await card_job(sessions, user_id) for _ in range(3)]
            await eventually(
                lambda: queue_depth(amqp_url, queue, 3), within=30, what="3 messages queued"
            )
            for job_id in jobs:  # nobody runs them while paused
                assert (await job_status(sessions, job_id)) == "PENDING"

            await pause(admin, "resume")
            await eventually(
                lambda: consumers_are(amqp_url, queue, 2),
                within=PAUSE_WITHIN,
                what="both workers to consume again",
            )
            for job_id in jobs:
                job = await settled_job(sessions, job_id, within=30)
                assert job.status == "COMPLETED", job.error_message
            stop.set()
            await task
    finally:
        stop.set()
        await provider.aclose()


async def pause(admin: httpx.AsyncClient, verb: str) -> None:
    response = await admin.post(f"/admin/api/job-types/CARD_ANALYSIS/{verb}", headers=OP)
    assert response.status_code == 200, response.text


async def consumers_are(amqp_url: str, name: str, expected: int) -> bool:
    return (await counts(amqp_url, name))[0] == expected


async def queue_depth(amqp_url: str, name: str, expected: int) -> bool:
    return (await counts(amqp_url, name))[1] == expected


async def card_job(sessions: Sessions, user_id: uuid.UUID) -> uuid.UUID:
    content = f"Paused queues keep their messages {uuid.uuid4()}"
    scrap = Scrap(
        user_id=user_id, content=content, content_hash=hashlib.sha256(content.encode()).hexdigest()
    )
    async with sessions() as session, session.begin():
        session.add(scrap)
    job = await register_job(
        sessions, job_type=JobType.CARD_ANALYSIS, target_id=scrap.id, user_id=user_id
    )
    return job.job_id


async def job_status(sessions: Sessions, job_id: uuid.UUID) -> str:
    async with sessions() as session:
        job = await session.get(AsyncJob, job_id)
        assert job is not None
        return job.status


async def test_a_worker_whose_database_is_unreachable_stops_consuming_until_it_answers(
    fresh_db_url: str, amqp_url: str, topology: Topology
) -> None:
    """The breaker: the worker's database behind a proxy that is cut (connections reset,
    new ones refused, as a stopped server) — its consumers are cancelled, so the queue
    keeps its messages instead of lending them to a worker that can only requeue them;
    restored, it consumes again. The worker's engine is the one its settings build."""
    queue = topology.queue_name(JobType.CARD_ANALYSIS)
    stop = asyncio.Event()
    with TcpProxy(fresh_db_url) as proxy:
        settings = WorkerSettings(database_url=proxy.url, worker_database_timeout_seconds=2)
        engine = settings.database_engine(pool_size=4)
        runtime = WorkerRuntime(
            session_factory=create_session_factory(engine),
            amqp_url=amqp_url,
            topology=topology,
            handlers=build_handlers(build_provider("local")),
            config=FAST,
        )
        task = asyncio.create_task(runtime.run(stop))
        try:
            await asyncio.wait_for(runtime.connected.wait(), 20)
            assert await consumers_are(amqp_url, queue, 1)
            proxy.cut()
            await eventually(
                lambda: consumers_are(amqp_url, queue, 0),
                within=PAUSE_WITHIN,
                what="the worker to stop consuming while its database is unreachable",
            )
            proxy.restore()
            await eventually(
                lambda: consumers_are(amqp_url, queue, 1),
                within=PAUSE_WITHIN,
                what="the worker to consume again once its database answers",
            )
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await engine.dispose()
