"""Issue 35, acceptance 4: dead letters made by each of the worker's reasons and each of
the broker's show their reason, job type, time and source queue in the admin API and
`san-admin`; listing twice leaves the queue as it was; re-driving a valid one completes
its job, a malformed one answers "not re-drivable" with the reason. Real PostgreSQL,
RabbitMQ, relay and worker runtime; the API over HTTP for `san-admin`."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, ClassVar

import aio_pika
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.admin.cli import run as san_admin
from san_api.app import create_app
from san_common.broker.topology import Topology, adopt_legacy_dead_letters
from san_common.deployment import DEPLOYMENT_HEADER
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, WorkerRuntime
from san_relay.relay import Relay
from san_relay.settings import RelaySettings
from tests.admin.support import operator_headers
from tests.api.support import over_http
from tests.conftest import api_settings
from tests.faults.harness import seed
from tests.running import FAST
from tests.waiting import eventually, settled_job

pytestmark = pytest.mark.rabbit

OP = operator_headers("dlq-operator")
TOKEN = OP["Authorization"].removeprefix("Bearer ")
CARD, REFINE = JobType.CARD_ANALYSIS, JobType.SCRAP_REFINE


class Done(JobHandler[None, str]):
    job_type: ClassVar[str] = REFINE

    async def run(self, job: AsyncJob, payload: None) -> str:
        return "done"

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        return None


def envelope(job_id: uuid.UUID, job_type: str, **changes: object) -> bytes:
    body = {"version": 1, "message_id": str(uuid.uuid4()), "job_id": str(job_id),
            "job_type": job_type, "target_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
            "attempt": 1, "created_at": datetime.now(UTC).isoformat(), **changes}  # fmt: skip
    return json.dumps(body).encode()


@pytest.fixture
async def base_url(fresh_db_url: str, amqp_url: str, topology: Topology) -> AsyncIterator[str]:
    settings = api_settings(fresh_db_url, amqp_url, amqp_prefix=topology.prefix)
    async with over_http(create_app(settings)) as base:
        yield base


class Broker:
    """A plain AMQP client beside the system: publishes what a broken or foreign producer
    would, and plays the consumer that rejects or keeps giving back a message."""

    def __init__(self, channel: aio_pika.abc.AbstractChannel, topology: Topology) -> None:
        self.channel, self.topology = channel, topology

    async def publish(self, body: bytes, routing_key: str, **properties: Any) -> None:
        jobs = await self.channel.get_exchange(self.topology.jobs_exchange)
        await jobs.publish(aio_pika.Message(body, **properties), routing_key=routing_key)

    async def next_from(self, job_type: str) -> aio_pika.abc.AbstractIncomingMessage:
        queue = await self.channel.get_queue(self.topology.queue_name(job_type))
        found: list[aio_pika.abc.AbstractIncomingMessage] = []

        async def got() -> bool:
            message = await queue.get(no_ack=False, fail=False)
            if message is not None:
                found.append(message)
            return bool(found)

        await eventually(got, within=20, what=f"a message on the {job_type} queue")
        return found[0]

    async def dead_letters(self) -> int:
        queue = await self.channel.declare_queue(self.topology.dead_letter_queue, passive=True)
        return queue.declaration_result.message_count or 0

    async def one_more_dead_letter(self, before: int) -> None:
        async def arrived() -> bool:
            return await self.dead_letters() == before + 1

        await eventually(arrived, within=30, what=f"dead letter #{before + 1}")


async def test_every_dead_letter_says_why_listing_changes_nothing_and_redrive_reports_each(
    fresh_sessions: async_sessionmaker[AsyncSession],
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    base_url: str,
) -> None:
    stop = asyncio.Event()
    relay = Relay(
        RelaySettings(database_url=fresh_db_url, amqp_url=amqp_url, amqp_prefix=topology.prefix),
        fresh_sessions,
        topology,
    )
    tasks = [asyncio.create_task(relay.run(stop))]
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        broker = Broker(channel, topology)
        made: list[tuple[str, str, str]] = []  # (message id, reason, source queue) in order

        # The broker's reasons, on the CARD_ANALYSIS queue (no worker consumes it yet).
        valid = (await seed(fresh_sessions, 1, [CARD], label="dlq")).job_ids[0]
        original = await broker.next_from(CARD)  # the relay's message of a PENDING job
        await original.reject(requeue=False)
        made.append((str(original.message_id), "rejected", topology.queue_name(CARD)))
        await broker.one_more_dead_letter(0)

        await broker.publish(
            envelope(uuid.uuid4(), CARD), CARD, message_id="expired-1", expiration=0.05
        )
        made.append(("expired-1", "expired", topology.queue_name(CARD)))
        await broker.one_more_dead_letter(1)

        await broker.publish(envelope(uuid.uuid4(), CARD), CARD, message_id="poison-1")
        card_queue = await channel.get_queue(topology.queue_name(CARD))

        async def given_back_past_the_delivery_limit() -> bool:
            message = await card_queue.get(no_ack=False, fail=False)
            if message is not None:
                await message.nack(requeue=True)
            return await broker.dead_letters() == 3

        await eventually(given_back_past_the_delivery_limit, within=30, what="delivery limit")
        made.append(("poison-1", "delivery_limit", topology.queue_name(CARD)))

        # The worker's reasons, on the SCRAP_REFINE queue, one at a time (a known order).
        runtime = WorkerRuntime(
            session_factory=fresh_sessions,
            amqp_url=amqp_url,
            topology=topology,
            handlers={REFINE: Done(), CARD: Done()},
            config=FAST,
        )
        tasks.append(asyncio.create_task(runtime.run(stop)))
        await asyncio.wait_for(runtime.connected.wait(), 20)
        worker_made = [
            ("unreadable-1", "unreadable", b"{not json", {}),
            ("version-1", "version", envelope(uuid.uuid4(), REFINE, version=99), {}),
            ("unroutable-1", "unroutable", envelope(uuid.uuid4(), "NO_SUCH_TYPE"), {}),
            ("foreign-1", "foreign", envelope(valid, REFINE), {DEPLOYMENT_HEADER: "elsewhere"}),
            ("unknown-1", "unknown-job", envelope(uuid.uuid4(), REFINE), {}),
        ]
        for message_id, reason, body, headers in worker_made:
            before = await broker.dead_letters()
            await broker.publish(body, REFINE, message_id=message_id, headers=headers)
            made.append((message_id, reason, topology.queue_name(REFINE)))
            await broker.one_more_dead_letter(before)

        async with httpx.AsyncClient(base_url=base_url, headers=OP, timeout=30) as api:
            first = (await api.get("/admin/api/dead-letters")).json()
            partial = (await api.get("/admin/api/dead-letters", params={"limit": 3})).json()
            second = (await api.get("/admin/api/dead-letters")).json()
            # listing (all, or the head): the same letters, in the same order, unchanged
            assert first == second
            assert partial["items"] == first["items"][:3]
            assert first["total"] == len(made) == await broker.dead_letters()
            seen = [(m["messageId"], m["reason"], m["queue"]) for m in first["items"]]
            assert seen == made
            for item in first["items"]:
                assert item["jobType"], item
                assert item["deadLetteredAt"], item
                by = (
                    "broker"
                    if item["reason"] in ("rejected", "expired", "delivery_limit")
                    else "worker"
                )
                assert item["deadLetteredBy"] == by, item
            by_id = {m["messageId"]: m for m in first["items"]}
            assert by_id["unreadable-1"]["jobType"] == REFINE  # from the queue it came from
            assert by_id["foreign-1"]["detail"].startswith("a message of deployment elsewhere")

            # re-drive: a valid one runs; a malformed one stays, with the reason
            redriven = (
                await api.post("/admin/api/dead-letters/redrive", json={"messageId": made[0][0]})
            ).json()
            assert (redriven["count"], redriven["notRedrivable"], redriven["failed"]) == (1, 0, 0)
            assert redriven["items"][0]["result"] == "redriven"
            assert (await settled_job(fresh_sessions, valid)).status == "COMPLETED"

            refused = (
                await api.post(
                    "/admin/api/dead-letters/redrive", json={"messageId": "unreadable-1"}
                )
            ).json()
            assert (refused["count"], refused["notRedrivable"]) == (0, 1)
            [item] = refused["items"]
            assert item["result"] == "not-redrivable"
            assert item["reason"].startswith("not a job message"), item

            after = (await api.get("/admin/api/dead-letters")).json()
            assert [m["messageId"] for m in after["items"]] == [m[0] for m in made[1:]]

        # san-admin says the same, and exits 1 for what it could not re-drive
        code, out, err = await _san_admin(base_url, "dlq", "list")
        assert code == 0, err
        assert "version-1" in out and "version: envelope version 99" in out
        assert topology.queue_name(REFINE) in out
        code, out, err = await _san_admin(base_url, "dlq", "redrive", "--message-id", "foreign-1")
        assert code == 1
        assert "foreign-1: not-redrivable: a message of deployment elsewhere" in out
        assert "redrive: 0 re-driven, 1 not re-drivable, 0 failed" in out
        assert "not re-driven" in err
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await connection.close()


async def _san_admin(url: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(san_admin, ["--url", url, "--token", TOKEN, *argv], out, err)
    return code, out.getvalue(), err.getvalue()


async def test_the_dead_letters_of_the_earlier_quorum_queue_are_adopted_in_order(
    amqp_url: str, topology: Topology
) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        legacy = await channel.declare_queue(
            topology.legacy_dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await legacy.bind(topology.dead_letter_exchange, routing_key=CARD)
        for n in range(3):
            await channel.default_exchange.publish(
                aio_pika.Message(f"letter {n}".encode(), headers={"x-san-reason": "unreadable"}),
                routing_key=topology.legacy_dead_letter_queue,
            )
        assert await adopt_legacy_dead_letters(connection, topology) == 3
        assert await adopt_legacy_dead_letters(connection, topology) == 0  # gone: nothing to do
        dead = await channel.get_queue(topology.dead_letter_queue)
        bodies = []
        while (message := await dead.get(no_ack=True, fail=False)) is not None:
            bodies.append((message.body, (message.headers or {}).get("x-san-reason")))
        assert bodies == [(f"letter {n}".encode(), "unreadable") for n in range(3)]
        check = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await check.declare_queue(topology.legacy_dead_letter_queue, passive=True)
