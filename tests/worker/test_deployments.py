"""Two deployments on one broker (docs/architecture.md, "Deployment identity"): a prefix is
held by one deployment at a time, and a worker dead-letters, never acks, a message of
another deployment or of a job its database does not know — each with its reason, time
and source queue."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import ClassVar

import aio_pika
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import deployment
from san_common.broker.ownership import PrefixInUse
from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, WorkerRuntime
from san_relay.relay import Relay
from san_relay.settings import RelaySettings
from tests.faults.harness import seed
from tests.running import FAST, worker_and_relay
from tests.waiting import eventually, settled_job

pytestmark = pytest.mark.rabbit


class Done(JobHandler[None, str]):
    job_type: ClassVar[str] = JobType.SCRAP_REFINE

    async def run(self, job: AsyncJob, payload: None) -> str:
        return "done"

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        return None


@pytest.fixture
async def other_deployment(
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """A database of another deployment (a clone of the template is a copy of the same
    deployment, so it gets an identity of its own)."""
    async with fresh_sessions() as session, session.begin():
        await session.execute(text("UPDATE deployment SET deployment_id = gen_random_uuid()"))
    yield fresh_sessions


def _envelope(job_id: uuid.UUID, job_type: str) -> bytes:
    return json.dumps(
        {
            "message_id": str(uuid.uuid4()),
            "job_id": str(job_id),
            "job_type": job_type,
            "target_id": str(uuid.uuid4()),
            "user_id": str(uuid.uuid4()),
            "attempt": 1,
            "created_at": datetime.now(UTC).isoformat(),
        }
    ).encode()


async def test_a_second_deployment_on_a_held_prefix_is_refused_before_it_consumes(
    sessions: async_sessionmaker[AsyncSession],
    db_url: str,
    fresh_db_url: str,
    other_deployment: async_sessionmaker[AsyncSession],
    amqp_url: str,
    topology: Topology,
) -> None:
    ours = await deployment.identity(sessions)
    theirs = await deployment.identity(other_deployment)
    assert ours != theirs
    async with worker_and_relay(
        sessions, db_url, amqp_url, topology, {JobType.SCRAP_REFINE: Done()}
    ):
        intruder = WorkerRuntime(
            session_factory=other_deployment,
            amqp_url=amqp_url,
            topology=topology,
            handlers={JobType.SCRAP_REFINE: Done()},
            config=FAST,
        )
        with pytest.raises(PrefixInUse) as refused:
            await asyncio.wait_for(intruder.run(asyncio.Event()), 20)
        message = str(refused.value)
        assert "\n" not in message
        assert ours in message and theirs in message and "AMQP_PREFIX" in message
        assert not intruder.consuming()
        relay = Relay(
            RelaySettings(
                database_url=fresh_db_url, amqp_url=amqp_url, amqp_prefix=topology.prefix
            ),
            other_deployment,
            topology,
        )
        with pytest.raises(PrefixInUse):
            await asyncio.wait_for(relay.run(asyncio.Event()), 20)
        # the same deployment's second worker is welcome
        twin = WorkerRuntime(
            session_factory=sessions,
            amqp_url=amqp_url,
            topology=topology,
            handlers={JobType.SCRAP_REFINE: Done()},
            config=FAST,
        )
        stop = asyncio.Event()
        running = asyncio.create_task(twin.run(stop))
        await asyncio.wait_for(twin.connected.wait(), 20)
        stop.set()
        await running


async def test_foreign_and_unknown_job_messages_are_dead_lettered_with_their_reason(
    fresh_sessions: async_sessionmaker[AsyncSession],
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
) -> None:
    queue = topology.queue_name(JobType.SCRAP_REFINE)
    async with worker_and_relay(
        fresh_sessions, fresh_db_url, amqp_url, topology, {JobType.SCRAP_REFINE: Done()}
    ):
        seeded = await seed(fresh_sessions, 1, [JobType.SCRAP_REFINE], label="deployments")
        foreign_job = seeded.job_ids[0]  # a job id we know, in a message that is not ours
        connection = await aio_pika.connect(amqp_url)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            jobs = await channel.get_exchange(topology.jobs_exchange)
            await jobs.publish(
                aio_pika.Message(
                    _envelope(foreign_job, JobType.SCRAP_REFINE),
                    headers={deployment.DEPLOYMENT_HEADER: "another-deployment"},
                ),
                routing_key=JobType.SCRAP_REFINE,
            )
            unknown = uuid.uuid4()
            await jobs.publish(
                aio_pika.Message(_envelope(unknown, JobType.SCRAP_REFINE)),
                routing_key=JobType.SCRAP_REFINE,
            )
            dead = await channel.get_queue(topology.dead_letter_queue)
            letters: dict[str, aio_pika.abc.AbstractIncomingMessage] = {}

            async def both_dead_lettered() -> bool:
                message = await dead.get(no_ack=True, fail=False)
                if message is not None:
                    letters[json.loads(message.body)["job_id"]] = message
                return len(letters) == 2

            await eventually(both_dead_lettered, within=20, what="both dead-lettered")
        for job_id, reason in ((foreign_job, "foreign"), (unknown, "unknown-job")):
            headers = letters[str(job_id)].headers or {}
            assert headers["x-san-reason"] == reason
            assert headers["x-san-queue"] == queue
            assert isinstance(headers["x-san-dead-lettered-at"], datetime)
        # our own message of that job still ran it
        assert (await settled_job(fresh_sessions, foreign_job)).status == "COMPLETED"
