"""Acceptance 3 (cancel): a cancelled PENDING job is never run — its message is delivered,
acked and skipped by the worker, the AI is never called, and the job stays CANCELLED."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, OutboxMessage, Scrap
from tests.admin.support import Sessions, new_user, operator_headers
from tests.api.support import api_with
from tests.conftest import api_settings
from tests.fakes.fake_ai import FakeAiServer
from tests.running import worker_and_relay
from tests.waiting import eventually, settled_job

pytestmark = pytest.mark.rabbit


async def test_a_cancelled_job_is_skipped_by_the_worker(
    fresh_db_url: str, amqp_url: str, topology: Topology, fake_ai: FakeAiServer
) -> None:
    engine = create_engine(fresh_db_url, pool_size=10)
    sessions = create_session_factory(engine)
    provider = build_provider(
        "openai", base_url=fake_ai.base_url, api_key="sk-test-key-123456", timeout_seconds=2
    )
    try:
        user_id, _ = await new_user(sessions)
        needle = f"never analysed {uuid.uuid4()}"
        scrap = await a_scrap(sessions, user_id, needle)
        other = await a_scrap(sessions, user_id, f"analysed {uuid.uuid4()}")
        cancelled = await register_job(
            sessions, job_type=JobType.CARD_ANALYSIS, target_id=scrap.id, user_id=user_id
        )
        settings = api_settings(fresh_db_url, amqp_url, amqp_prefix=topology.prefix)
        async with api_with(settings) as admin:
            response = await admin.post(
                f"/admin/api/jobs/{cancelled.job_id}/cancel", headers=operator_headers()
            )
            assert response.status_code == 200, response.text
        skipped_before = skipped()
        async with worker_and_relay(
            sessions, fresh_db_url, amqp_url, topology, build_handlers(provider)
        ):
            # a job registered after it, on the same queue, completes: the cancelled one's
            # message went first and was skipped
            later = await register_job(
                sessions, job_type=JobType.CARD_ANALYSIS, target_id=other.id, user_id=user_id
            )
            assert (await settled_job(sessions, later.job_id)).status == "COMPLETED"

            async def published() -> bool:
                async with sessions() as session:
                    left = await session.scalar(
                        select(func.count())
                        .select_from(OutboxMessage)
                        .where(OutboxMessage.published_at.is_(None))
                    )
                return left == 0

            await eventually(published, within=30, what="the relay to publish both messages")

            async def was_skipped() -> bool:
                return skipped() > skipped_before

            await eventually(was_skipped, within=30, what="the worker to skip the message")
        async with sessions() as session:
            job = await session.get(AsyncJob, cancelled.job_id)
        assert job is not None and job.status == "CANCELLED" and job.started_at is None
        asked = [json.dumps(body) for _path, body in fake_ai.requests]
        assert not any(needle in text for text in asked), "the AI saw the cancelled job's scrap"
    finally:
        await provider.aclose()
        await engine.dispose()


def skipped() -> float:
    value = REGISTRY.get_sample_value(
        "san_messages_skipped_total", {"job_type": JobType.CARD_ANALYSIS.value}
    )
    return value or 0.0


async def a_scrap(sessions: Sessions, user_id: uuid.UUID, content: str) -> Scrap:
    scrap = Scrap(
        user_id=user_id, content=content, content_hash=hashlib.sha256(content.encode()).hexdigest()
    )
    async with sessions() as session, session.begin():
        session.add(scrap)
    return scrap
