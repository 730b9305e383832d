"""A job type added only the way docs/architecture.md says — a spec, a handler module, an
endpoint — runs end to end: API → outbox → relay → RabbitMQ → worker → COMPLETED (or
FAILED), its target row's status moved by the runtime from the spec's mirror, and the admin
API and recovery reading its target from the spec. Nothing outside tests/jobtype names the
type (issue 35, acceptance 7)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import aio_pika
import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.app import create_app
from san_common.broker.topology import Topology
from san_common.jobs import registry
from san_common.jobs.registration import register_job
from san_common.models import AsyncJob, OutboxMessage
from san_common.worker import collect
from san_recovery.repository import TargetState, target_state
from tests.admin.support import operator_headers
from tests.conftest import api_settings
from tests.jobtype import endpoint
from tests.jobtype.spec import METADATA, SPEC, WORD_COUNTS
from tests.running import worker_and_relay
from tests.waiting import settled_job_via_api

pytestmark = pytest.mark.rabbit


@pytest.fixture
async def word_counts(
    fresh_sessions: async_sessionmaker[AsyncSession], amqp_url: str, topology: Topology
) -> AsyncIterator[registry.JobSpec]:
    """The type registered, as a service registers it at start-up; its target table in the
    test's database; its queue deleted afterwards (the topology fixture knows only the
    types registered when it ran)."""
    async with fresh_sessions() as session, session.begin():
        await (await session.connection()).run_sync(METADATA.create_all)
    with registry.registered(SPEC):
        try:
            yield SPEC
        finally:
            connection = await aio_pika.connect(amqp_url)
            await (await connection.channel()).queue_delete(topology.queue_name(SPEC.job_type))
            await connection.close()


async def test_a_job_type_added_as_the_docs_say_runs_end_to_end(
    word_counts: registry.JobSpec,
    fresh_sessions: async_sessionmaker[AsyncSession],
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    new_user: object,
) -> None:
    app = create_app(api_settings(fresh_db_url, amqp_url))
    app.include_router(endpoint.router)
    handlers = collect("tests.jobtype.handler", consumer=word_counts.consumer)
    headers = new_user()  # type: ignore[operator]
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as api,
        worker_and_relay(fresh_sessions, fresh_db_url, amqp_url, topology, handlers),
    ):
        counted = await api.post("/word-counts", json={"text": "one two  three"}, headers=headers)
        empty = await api.post("/word-counts", json={"text": "   "}, headers=headers)
        assert (counted.status_code, empty.status_code) == (202, 202), empty.text
        done = await settled_job_via_api(api, headers, counted.json()["jobId"])
        failed = await settled_job_via_api(api, headers, empty.json()["jobId"])
        detail = await api.get(f"/admin/api/jobs/{done['jobId']}", headers=operator_headers())

    assert (done["jobType"], done["status"], done["tries"]) == (SPEC.job_type, "COMPLETED", 1)
    assert failed["status"] == "FAILED" and failed["errorMessage"]
    counted_id = uuid.UUID(counted.json()["wordCountId"])
    empty_id = uuid.UUID(empty.json()["wordCountId"])
    async with fresh_sessions() as session:
        rows = {
            row.id: row
            for row in await session.execute(
                select(
                    WORD_COUNTS.c.id,
                    WORD_COUNTS.c.words,
                    WORD_COUNTS.c.status,
                    WORD_COUNTS.c.error_message,
                )
            )
        }
        # the mirror, moved by the runtime in the job's own statements
        assert (rows[counted_id].words, rows[counted_id].status) == (3, "COMPLETED")
        assert rows[counted_id].error_message is None
        assert (rows[empty_id].words, rows[empty_id].status) == (None, "FAILED")
        # what users read of a failure: its sanitized summary, as the job shows it
        assert rows[empty_id].error_message == failed["errorMessage"]
        assert await target_state(session, SPEC.job_type, counted_id) is TargetState.DONE
        assert await target_state(session, SPEC.job_type, empty_id) is TargetState.OPEN
    assert detail.status_code == 200, detail.text
    assert detail.json()["target"] == {
        "table": "san_test_word_counts",
        "exists": True,
        "status": "COMPLETED",
    }


async def test_a_type_not_registered_is_refused_before_anything_is_written(
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    count = select(func.count()).select_from(AsyncJob)
    outbox = select(func.count()).select_from(OutboxMessage)
    async with fresh_sessions() as session:
        before = (await session.scalar(count), await session.scalar(outbox))
    with pytest.raises(registry.UnknownJobType):
        await register_job(
            fresh_sessions, job_type=SPEC.job_type, target_id=uuid.uuid4(), user_id=uuid.uuid4()
        )
    async with fresh_sessions() as session:
        assert (await session.scalar(count), await session.scalar(outbox)) == before
