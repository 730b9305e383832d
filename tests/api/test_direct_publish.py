"""The API's direct publish in-process (docs/architecture.md, "Direct publish"): the message
it publishes carries what the relay's carries, and with the broker away the API serves and
leaves every message to the relay. Its crash windows: tests/faults/test_publish_after_commit.py."""

from __future__ import annotations

import json
import uuid

import aio_pika
import asyncpg
import httpx
import pytest

from san_api.app import create_app
from san_api.auth.tokens import mint
from san_common.broker.topology import Topology
from san_common.db.engine import plain_url
from san_common.deployment import DEPLOYMENT_HEADER
from tests import infra
from tests.conftest import JWT_SECRET, api_settings
from tests.waiting import eventually

pytestmark = [pytest.mark.rabbit, pytest.mark.timeout(60)]


async def _rows(db_url: str, job_ids: list[str]) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(plain_url(db_url))
    try:
        return await connection.fetch(
            "SELECT message_id, direct, published_at, available_at > created_at AS later"
            " FROM outbox_messages WHERE body->>'job_id' = ANY($1::text[]) ORDER BY id",
            job_ids,
        )
    finally:
        await connection.close()


async def test_the_api_publishes_as_the_relay_does_and_marks_the_row(
    db_url: str, amqp_url: str, topology: Topology
) -> None:
    app = create_app(
        api_settings(db_url, amqp_url, amqp_prefix=topology.prefix, api_direct_publish=True)
    )
    async with app.router.lifespan_context(app):

        async def ready() -> bool:
            return bool(app.state.publisher.ready())

        await eventually(ready, within=20, what="the direct publisher ready")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            response = await client.post(
                "/scraps",
                json={"content": f"direct {uuid.uuid4()}"},
                headers={
                    "Authorization": f"Bearer {mint(JWT_SECRET, 'direct-' + uuid.uuid4().hex)}"
                },
            )
        assert response.status_code == 202, response.text
        job_id = response.json()["analysisJobId"]

        async def marked() -> bool:
            return all(r["published_at"] is not None for r in await _rows(db_url, [job_id]))

        await eventually(marked, within=10, what="the row marked")
        [row] = await _rows(db_url, [job_id])
        assert row["direct"] and row["later"]  # due for the relay only after the grace
        deployment_id = await _deployment_id(db_url)

    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(topology.queue_name("CARD_ANALYSIS"), ensure=True)
        message = await queue.get(timeout=5, fail=True)
        assert message is not None
        await message.ack()
    finally:
        await connection.close()
    assert message.message_id == str(row["message_id"])
    assert message.type == "CARD_ANALYSIS"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.content_type == "application/json"
    assert message.headers[DEPLOYMENT_HEADER] == deployment_id
    assert json.loads(message.body)["job_id"] == job_id


async def test_with_the_broker_away_the_api_serves_and_leaves_messages_to_the_relay(
    db_url: str, amqp_url: str, topology: Topology
) -> None:
    nowhere = f"amqp://guest:guest@127.0.0.1:{infra.free_port()}/"
    app = create_app(
        api_settings(db_url, nowhere, amqp_prefix=topology.prefix, api_direct_publish=True)
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            response = await client.post(
                "/scraps",
                json={"content": f"no broker {uuid.uuid4()}"},
                headers={
                    "Authorization": f"Bearer {mint(JWT_SECRET, 'nobroker-' + uuid.uuid4().hex)}"
                },
            )
        assert response.status_code == 202, response.text
        body = response.json()
        rows = await _rows(db_url, [body["analysisJobId"], body["refineJobId"]])
        # registered due at once, for the relay
        assert [(r["direct"], r["later"], r["published_at"]) for r in rows] == [
            (False, False, None),
            (False, False, None),
        ]


def _bearer(label: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint(JWT_SECRET, f'{label}-{uuid.uuid4().hex}')}"}


async def _deployment_id(db_url: str) -> str:
    connection = await asyncpg.connect(plain_url(db_url))
    try:
        return str(await connection.fetchval("SELECT deployment_id FROM deployment"))
    finally:
        await connection.close()
