"""Issue 40: the API publishes a job's message itself right after its commit, with the relay
as the fallback (docs/architecture.md, "Direct publish"). The API runs as an OS process;
its faults are real: a TCP proxy frozen in front of its broker or database connection, and
SIGKILL.

1. killed between commit and publish (its broker connection frozen): the relay publishes
   after the grace, and the jobs complete once;
2. killed between publish and mark (its database connection frozen after the confirm): the
   relay publishes again after the grace, and the worker completes each job once — one
   card, one AI call per job;
3. the normal path: the API publishes and marks within the grace, and the relay publishes
   nothing of it;
4. a user's second active job of a type is not published directly: it goes through the
   relay (its fair window).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.auth.tokens import mint
from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from tests import infra
from tests.conftest import JWT_SECRET
from tests.faults.harness import FaultStack, cards_per_scrap, job_rows, json_lines
from tests.procs import ServiceProcess, wait_healthy
from tests.tcp_proxy import TcpProxy
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(180)]

GRACE = 6.0  # API_DIRECT_GRACE_SECONDS: long enough for each step the tests take inside it
POLL = 1.0  # RELAY_POLL_SECONDS
CHAT = "/v1/chat/completions"
READY = "direct publish ready"
JOB_TYPES = (JobType.CARD_ANALYSIS, JobType.SCRAP_REFINE)


async def _start_api(stack: FaultStack, **overrides: str) -> tuple[ServiceProcess, str]:
    port = infra.free_port()
    api = stack.start(
        "api",
        API_HOST="127.0.0.1",
        API_PORT=str(port),
        API_DIRECT_GRACE_SECONDS=str(GRACE),
        # a frozen broker connection holds a publish for as long as the test needs
        API_DIRECT_CONFIRM_SECONDS="60",
        **overrides,
    )
    base_url = f"http://127.0.0.1:{port}"
    await asyncio.to_thread(wait_healthy, base_url, api)

    async def publisher_ready() -> bool:
        return any(line.get("msg") == READY for line in json_lines(api.log()))

    await eventually(publisher_ready, within=30, what="the direct publisher", context=stack.logs)
    return api, base_url


async def _post_scrap(base_url: str, subject: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        response = await client.post(
            "/scraps", json={"content": f"direct publish {uuid.uuid4()}"}, headers=headers
        )
    assert response.status_code == 202, response.text
    return dict(response.json())


def _job_ids(*bodies: dict[str, Any]) -> list[uuid.UUID]:
    return [uuid.UUID(b[k]) for b in bodies for k in ("analysisJobId", "refineJobId")]


async def _outbox(
    db: async_sessionmaker[AsyncSession], job_ids: list[uuid.UUID]
) -> list[dict[str, Any]]:
    """The outbox rows of these jobs: `direct`, and when they fell due and were marked, in
    seconds after their creation (None: unmarked)."""
    async with db() as session:
        result = await session.execute(
            text(
                "SELECT body->>'job_id' AS job_id, direct,"
                " extract(epoch FROM available_at - created_at)::float8 AS due_after,"
                " extract(epoch FROM published_at - created_at)::float8 AS marked_after"
                " FROM outbox_messages WHERE (body->>'job_id')::uuid = ANY(:ids) ORDER BY id"
            ),
            {"ids": job_ids},
        )
        return [dict(row._mapping) for row in result]


async def _completed(db: async_sessionmaker[AsyncSession], job_ids: list[uuid.UUID]) -> bool:
    rows = await job_rows(db, job_ids)
    return len(rows) == len(job_ids) and all(r["status"] == "COMPLETED" for r in rows.values())


async def _ready_messages(amqp_url: str, topology: Topology) -> int:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        total = 0
        for name in {topology.queue_name(str(t)) for t in JOB_TYPES}:
            queue = await channel.declare_queue(name, passive=True)
            total += queue.declaration_result.message_count or 0
        return total
    finally:
        await connection.close()


async def _metric(base_url: str, series: str) -> float:
    async with httpx.AsyncClient(timeout=5) as client:
        body = (await client.get(f"{base_url}/metrics")).text
    match = re.search(rf"^{re.escape(series)} ([0-9.e+-]+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_killed_between_commit_and_publish_the_relay_publishes_after_the_grace(
    stack: FaultStack, db: async_sessionmaker[AsyncSession], amqp_url: str, tmp_path: Path
) -> None:
    stack.start("relay", RELAY_POLL_SECONDS=str(POLL))
    stack.start("ai-worker")
    with TcpProxy(amqp_url) as broker:
        api, base_url = await _start_api(stack, AMQP_URL=broker.url)
        broker.freeze()  # the publish leaves the API and goes nowhere, unconfirmed
        body = await _post_scrap(base_url, f"commit-publish-{uuid.uuid4().hex}")
        job_ids = _job_ids(body)
        rows = await _outbox(db, job_ids)
        assert [r["direct"] for r in rows] == [True, True], rows
        assert all(r["marked_after"] is None for r in rows), rows
        api.kill()
        broker.cut()  # what the killed API had sent is dropped, never delivered
        killed = time.monotonic()
    await eventually(
        lambda: _completed(db, job_ids), within=60, what="the jobs completed",
        context=stack.logs,
    )  # fmt: skip
    healed = time.monotonic() - killed
    rows = await _outbox(db, job_ids)
    for row in rows:
        # the relay's fallback: not before the grace, and within grace + poll (+ a round)
        assert GRACE <= row["marked_after"] <= GRACE + POLL + 2.0, rows
    assert list((await cards_per_scrap(db, [uuid.UUID(body["scrapId"])])).values()) == [1]
    assert stack.ai.passed(CHAT) == 2  # one call per job: the analysis and the refine
    print(f"published by the relay {healed:.1f} s after the kill")


async def test_killed_between_publish_and_mark_the_duplicate_is_completed_once(
    stack: FaultStack,
    db: async_sessionmaker[AsyncSession],
    amqp_url: str,
    fresh_db_url: str,
    tmp_path: Path,
) -> None:
    stack.start("relay", RELAY_POLL_SECONDS=str(POLL))
    probe = infra.free_port()
    worker = stack.start("ai-worker", PROBE_PORT=str(probe))
    worker_url = f"http://127.0.0.1:{probe}"
    await asyncio.to_thread(wait_healthy, worker_url, worker)
    with TcpProxy(amqp_url) as broker, TcpProxy(fresh_db_url) as database:
        api, base_url = await _start_api(stack, AMQP_URL=broker.url, DATABASE_URL=database.url)
        broker.freeze()
        body = await _post_scrap(base_url, f"publish-mark-{uuid.uuid4().hex}")  # committed
        job_ids = _job_ids(body)
        database.freeze()  # the mark will hang
        broker.thaw()  # the publish goes through and is confirmed

        # the worker completes both jobs from the API's messages while their rows are
        # still unmarked: published, not marked
        await eventually(
            lambda: _completed(db, job_ids), within=GRACE - 1, what="the direct messages' jobs",
            context=stack.logs,
        )  # fmt: skip
        rows = await _outbox(db, job_ids)
        assert all(r["direct"] and r["marked_after"] is None for r in rows), rows
        api.kill()
        database.cut()  # the killed API's mark is dropped, never delivered

    async def republished() -> bool:
        return all(r["marked_after"] is not None for r in await _outbox(db, job_ids))

    await eventually(
        republished, within=GRACE + POLL + 15, what="the relay's republish", context=stack.logs
    )
    rows = await _outbox(db, job_ids)
    assert all(r["marked_after"] >= GRACE for r in rows), rows  # by the relay, after grace

    async def duplicates_dropped() -> bool:
        body = await _worker_metrics(worker_url)
        return sum(_skipped(body, str(t)) for t in JOB_TYPES) >= 2

    await eventually(
        duplicates_dropped, within=30, what="the worker dropping both duplicates",
        context=stack.logs,
    )  # fmt: skip
    assert await _completed(db, job_ids)
    assert list((await cards_per_scrap(db, [uuid.UUID(body["scrapId"])])).values()) == [1]
    assert stack.ai.passed(CHAT) == 2  # the duplicates never reached the AI
    tries = {r["tries"] for r in (await job_rows(db, job_ids)).values()}
    assert tries == {1}, tries


async def _worker_metrics(base_url: str) -> str:
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(f"{base_url}/metrics")).text


def _skipped(body: str, job_type: str) -> float:
    match = re.search(
        rf'^san_messages_skipped_total\{{job_type="{job_type}"\}} ([0-9.e+-]+)$',
        body,
        re.MULTILINE,
    )
    return float(match.group(1)) if match else 0.0


async def test_the_api_publishes_and_marks_within_the_grace_and_the_relay_publishes_nothing(
    stack: FaultStack,
    db: async_sessionmaker[AsyncSession],
    amqp_url: str,
    topology: Topology,
    tmp_path: Path,
) -> None:
    stack.start("relay", RELAY_POLL_SECONDS=str(POLL))
    _, base_url = await _start_api(stack)
    users = 5
    bodies = []
    for n in range(users):  # paced: one at a time, each user's first job of each type
        bodies.append(await _post_scrap(base_url, f"normal-{n}-{uuid.uuid4().hex}"))
    job_ids = _job_ids(*bodies)

    async def all_marked() -> bool:
        return all(r["marked_after"] is not None for r in await _outbox(db, job_ids))

    await eventually(all_marked, within=GRACE, what="the API marking its publications")
    rows = await _outbox(db, job_ids)
    assert all(r["direct"] for r in rows), rows
    assert all(r["marked_after"] < GRACE for r in rows), rows
    assert await _metric(base_url, "san_outbox_direct_published_total") == 2 * users
    # Past every row's grace and a poll of the relay: had it published any of them too,
    # the queues would hold more than one message per job.
    await asyncio.sleep(GRACE + POLL + 1.0)  # the absence of the relay's publish is the test
    assert await _ready_messages(amqp_url, topology) == 2 * users
    worker = stack.start("ai-worker")
    await eventually(
        lambda: _completed(db, job_ids), within=60, what="the jobs completed",
        context=stack.logs,
    )  # fmt: skip
    assert worker.popen.poll() is None


async def test_a_users_second_active_job_of_a_type_goes_through_the_relay(
    stack: FaultStack,
    db: async_sessionmaker[AsyncSession],
    amqp_url: str,
    topology: Topology,
    tmp_path: Path,
) -> None:
    stack.start("relay", RELAY_POLL_SECONDS=str(POLL))
    _, base_url = await _start_api(stack)
    subject = f"burst-{uuid.uuid4().hex}"
    first = await _post_scrap(base_url, subject)
    second = await _post_scrap(base_url, subject)  # the first's jobs are still PENDING
    first_rows = await _outbox(db, _job_ids(first))
    second_rows = await _outbox(db, _job_ids(second))
    assert [r["direct"] for r in first_rows] == [True, True], first_rows
    assert [r["direct"] for r in second_rows] == [False, False], second_rows
    assert all(r["due_after"] == 0 for r in second_rows), second_rows  # due at once

    async def all_published() -> bool:
        rows = await _outbox(db, _job_ids(first, second))
        return all(r["marked_after"] is not None for r in rows)

    await eventually(all_published, within=GRACE, what="every message published")
    assert await _metric(base_url, "san_outbox_direct_published_total") == 2
    assert await _ready_messages(amqp_url, topology) == 4
