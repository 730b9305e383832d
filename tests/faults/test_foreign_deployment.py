"""Issue 35, acceptance 2, on OS processes: another deployment on this stack's queues. A
foreign consumer acks everything on the job queues for 10 s (what a second stack's worker
did before deployments had identities) and a foreign relay publishes its own messages
there, while 20 scraps are registered. Every job still ends COMPLETED (the jobs whose
messages the foreign consumer swallowed are published again by the stranded-message
check), and every foreign message this stack's worker received is dead-lettered with
reason "foreign", with one WARNING in its log. A second stack started on the same prefix
refuses to start, with one line."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aio_pika
import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology
from san_common.db.engine import plain_url
from san_common.deployment import DEPLOYMENT_HEADER
from san_common.jobs.types import JobType
from tests import infra
from tests.faults.harness import FaultStack, cards_per_scrap, seed, statuses
from tests.procs import wait_until
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(300)]

SCRAPS = 20
TYPES = (JobType.CARD_ANALYSIS, JobType.SCRAP_REFINE)
FOREIGN_SECONDS = 10.0
# The stranded-message check publishes a vanished job's message again within 60 s of the
# job being due; the rest is the jobs' own run time on this machine.
COMPLETED_WITHIN = 90.0
FOREIGN_DEPLOYMENT = "a-foreign-deployment"


def _foreign_envelope(job_type: str) -> bytes:
    body = {"message_id": str(uuid.uuid4()), "job_id": str(uuid.uuid4()), "job_type": job_type,
            "target_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()), "attempt": 1,
            "created_at": datetime.now(UTC).isoformat()}  # fmt: skip
    return json.dumps(body).encode()


async def test_a_foreign_consumer_and_foreign_messages_strand_nothing_and_leave_a_trace(
    stack: FaultStack,
    db: async_sessionmaker[AsyncSession],
    amqp_url: str,
    topology: Topology,
    other_db_url: str,
) -> None:
    stack.start("relay")
    worker = stack.start("ai-worker")
    stack.start("recovery")
    stack.ai.open_gate()
    wait_until(lambda: "worker consuming" in worker.log(), 60, "the worker consuming")

    connection = await aio_pika.connect(amqp_url)
    swallowed: list[str] = []  # message ids the foreign consumer acked
    foreign_ids: list[str] = []
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=50)

        async def swallow(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            swallowed.append(str(message.message_id))
            await message.ack()

        tags = []
        for job_type in TYPES:
            queue = await channel.get_queue(topology.queue_name(job_type))
            tags.append((queue, await queue.consume(swallow)))
        jobs = await channel.get_exchange(topology.jobs_exchange)
        seeded = []
        loop = asyncio.get_running_loop()
        until = loop.time() + FOREIGN_SECONDS
        for n in range(SCRAPS):  # spread over the foreign consumer's 10 s
            seeded.append(await seed(db, 1, TYPES, label=f"foreign-{n}"))
            for job_type in TYPES:
                message_id = f"foreign-{uuid.uuid4()}"
                foreign_ids.append(message_id)
                await jobs.publish(
                    aio_pika.Message(
                        _foreign_envelope(job_type),
                        message_id=message_id,
                        headers={DEPLOYMENT_HEADER: FOREIGN_DEPLOYMENT},
                    ),
                    routing_key=job_type,
                )
            await asyncio.sleep(max(0.0, (until - loop.time()) / (SCRAPS - n)))
        for queue, tag in tags:
            await queue.cancel(tag)
        job_ids = [j for s in seeded for j in s.job_ids]
        scrap_ids = [s for x in seeded for s in x.scrap_ids]
        ours_swallowed = [m for m in swallowed if not m.startswith("foreign-")]
        assert ours_swallowed, "the foreign consumer took none of this stack's messages"

        async def all_completed() -> bool:
            return (await statuses(db, job_ids)).get("COMPLETED", 0) == len(job_ids)

        await eventually(
            all_completed,
            within=COMPLETED_WITHIN,
            what="every job COMPLETED although the foreign consumer took some messages",
            interval=0.5,
            context=lambda: f"{len(ours_swallowed)} swallowed\n" + stack.logs(tail=2000),
        )
        assert sorted((await cards_per_scrap(db, scrap_ids)).values()) == [1] * SCRAPS

        # every foreign message was either swallowed by the foreign consumer or received
        # by this stack's worker, which dead-lettered it with reason "foreign"
        dead = await channel.get_queue(topology.dead_letter_queue)
        dead_lettered: dict[str, str] = {}
        while (message := await dead.get(no_ack=True, fail=False)) is not None:
            reason = (message.headers or {}).get("x-san-reason")
            dead_lettered[str(message.message_id)] = str(reason)
        received = [m for m in foreign_ids if m not in swallowed]
        assert received, "this stack's worker received none of the foreign messages"
        assert {m: dead_lettered.get(m) for m in received} == dict.fromkeys(received, "foreign")
    finally:
        await connection.close()
    warnings = [
        entry["msg"]
        for entry in map(_json, worker.log().splitlines())
        if entry.get("level") == "warning" and "another deployment" in entry.get("msg", "")
    ]
    assert len(warnings) == 1, warnings  # one, however many foreign messages arrived
    assert "AMQP_PREFIX" in warnings[0] and "vhost" in warnings[0]

    # a second stack (its own database, so its own identity) on the same prefix
    intruder = stack.start("ai-worker", DATABASE_URL=other_db_url)
    wait_until(lambda: intruder.popen.poll() is not None, 60, "the second stack's worker to stop")
    assert intruder.popen.returncode == 2
    # one line of its own (besides its start-up log entries), and no traceback
    lines = [line for line in intruder.log().splitlines() if line.strip() and not _json(line)]
    assert len(lines) == 1, intruder.log()
    assert "belong to deployment" in lines[0] and "AMQP_PREFIX" in lines[0], lines[0]
    assert "Traceback" not in intruder.log()


def _json(line: str) -> dict[str, str]:
    try:
        entry = json.loads(line)
    except ValueError:
        return {}
    return entry if isinstance(entry, dict) else {}


@pytest.fixture
async def other_db_url(pg_server: str, template_db: str) -> AsyncIterator[str]:
    """Another deployment's database: a clone of the template is a copy of this stack's
    deployment, so it gets an identity of its own."""
    name = infra.unique_name("san_other")
    admin = await asyncpg.connect(plain_url(infra.with_database(pg_server, "postgres")))
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    finally:
        await admin.close()
    url = infra.with_database(pg_server, name)
    connection = await asyncpg.connect(plain_url(url))
    try:
        await connection.execute("UPDATE deployment SET deployment_id = gen_random_uuid()")
    finally:
        await connection.close()
    yield url
    admin = await asyncpg.connect(plain_url(infra.with_database(pg_server, "postgres")))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
