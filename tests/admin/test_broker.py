"""Queues and dead letters through the admin API, against the real broker: depths, peek
with RabbitMQ's reason and the job's error, re-drive one / by type, purge — nothing lost."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aio_pika
import httpx
import pytest

from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from tests.admin.support import Sessions, insert_jobs, new_user, operator_headers
from tests.api.support import api_with, assert_problem
from tests.conftest import api_settings

pytestmark = pytest.mark.rabbit

OP = operator_headers()


@pytest.fixture
async def admin(db_url: str, amqp_url: str, topology: Topology) -> AsyncIterator[httpx.AsyncClient]:
    async with api_with(api_settings(db_url, amqp_url, amqp_prefix=topology.prefix)) as client:
        yield client


async def dead_letter(
    amqp_url: str, topology: Topology, job_ids: list[uuid.UUID], job_type: str
) -> None:
    """Publish one message per job and reject it, so RabbitMQ dead-letters it (x-death)."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topology.jobs_exchange)
        queue = await channel.get_queue(topology.queue_name(JobType(job_type)))
        for job_id in job_ids:
            body = {"message_id": str(uuid.uuid4()), "job_id": str(job_id), "job_type": job_type,
                    "target_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()), "attempt": 1,
                    "created_at": datetime.now(UTC).isoformat()}  # fmt: skip
            await exchange.publish(
                aio_pika.Message(json.dumps(body).encode(), message_id=body["message_id"]),
                routing_key=job_type,
            )
        for _ in job_ids:
            message = await queue.get(no_ack=False, timeout=10)
            assert message is not None
            await message.reject(requeue=False)


def depth(queues: dict[str, object], name: str) -> int:
    return next(q["messages"] for q in queues["queues"] if q["name"] == name)  # type: ignore[index, attr-defined]


async def test_dead_letters_peek_redrive_purge(
    admin: httpx.AsyncClient, amqp_url: str, topology: Topology, sessions: Sessions
) -> None:
    user_id, _ = await new_user(sessions)
    failed = await insert_jobs(sessions, user_id, 2, error="CARD_ANALYSIS failed: poison")
    await dead_letter(amqp_url, topology, failed, "CARD_ANALYSIS")
    await dead_letter(amqp_url, topology, [uuid.uuid4()], "SCRAP_REFINE")
    card_queue = topology.queue_name(JobType.CARD_ANALYSIS)

    queues = (await admin.get("/admin/api/queues", headers=OP)).json()
    assert queues["source"] == "passive"
    assert depth(queues, topology.dead_letter_queue) == 3 and depth(queues, card_queue) == 0

    view = (await admin.get("/admin/api/dead-letters", headers=OP)).json()
    assert view["total"] == 3
    letters = {m["jobId"]: m for m in view["items"]}
    first = letters[str(failed[0])]
    assert first["reason"] == "rejected" and first["queue"] == card_queue
    assert first["jobStatus"] == "FAILED" and first["jobError"] == "CARD_ANALYSIS failed: poison"
    # peeking took nothing away
    again = (await admin.get("/admin/api/dead-letters", headers=OP)).json()
    assert again["total"] == 3

    one = await admin.post(
        "/admin/api/dead-letters/redrive", json={"messageId": first["messageId"]}, headers=OP
    )
    assert one.json()["count"] == 1
    queues = (await admin.get("/admin/api/queues", headers=OP)).json()
    assert depth(queues, topology.dead_letter_queue) == 2 and depth(queues, card_queue) == 1

    by_type = await admin.post(
        "/admin/api/dead-letters/purge", json={"jobType": "SCRAP_REFINE"}, headers=OP
    )
    assert by_type.json()["count"] == 1
    rest = await admin.post("/admin/api/dead-letters/redrive", json={"all": True}, headers=OP)
    assert rest.json()["count"] == 1
    queues = (await admin.get("/admin/api/queues", headers=OP)).json()
    assert depth(queues, topology.dead_letter_queue) == 0 and depth(queues, card_queue) == 2

    audit = (await admin.get("/admin/api/audit", headers=OP)).json()["items"]
    assert [(a["action"], a["count"]) for a in audit[:3]] == [
        ("dlq.redrive", 1),
        ("dlq.purge", 1),
        ("dlq.redrive", 1),
    ]


async def test_a_queue_not_declared_is_left_out_not_a_failed_page(
    admin: httpx.AsyncClient, amqp_url: str, topology: Topology
) -> None:
    lane = topology.bulk_queue_name(JobType.CARD_ANALYSIS)
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(lane)

    response = await admin.get("/admin/api/queues", headers=OP)

    assert response.status_code == 200
    names = [q["name"] for q in response.json()["queues"]]
    assert lane not in names
    # the queues after the missing one are read on a channel of their own
    assert topology.queue_name(JobType.SCRAP_REFINE) in names
    assert topology.dead_letter_queue in names


async def test_dead_letter_actions_need_exactly_one_selector(admin: httpx.AsyncClient) -> None:
    for body in ({}, {"all": True, "jobType": "CARD_ANALYSIS"}, {"jobType": "NOPE"}):
        response = await admin.post("/admin/api/dead-letters/purge", json=body, headers=OP)
        assert_problem(response, 400, "VALIDATION_ERROR")


async def test_an_unreachable_broker_is_503_not_500(db_url: str) -> None:
    settings = api_settings(db_url, "amqp://guest:guest@127.0.0.1:1/")
    async with api_with(settings) as client:
        for path in ("/admin/api/queues", "/admin/api/dead-letters"):
            assert_problem(await client.get(path, headers=OP), 503, "BROKER_UNAVAILABLE")
        response = await client.post(
            "/admin/api/dead-letters/redrive", json={"all": True}, headers=OP
        )
        assert_problem(response, 503, "BROKER_UNAVAILABLE")
