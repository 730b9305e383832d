"""Upstream text never reaches a job's owner: an AI call that fails with a body holding a
planted internal host name, file path and secret leaves `GET /async-jobs/{id}` with a short
summary (kind, upstream status, which call) and none of them; the log has the full cause
chain, with the secret redacted."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from tests.api.support import api_with, save_scrap
from tests.conftest import api_settings
from tests.fakes.fake_ai import FakeAiServer
from tests.running import worker_and_relay
from tests.waiting import settled_job_via_api

pytestmark = pytest.mark.rabbit

HOST = "pg-primary.corp.internal"
PATH = "/srv/san/private/ai-gateway.py"
SECRET = "sk-PLANTEDsecret0123456789"
API_KEY = "sk-test-key-123456"
PLANTED = f" upstream {HOST}:5432 raised at {PATH} line 7, using key {SECRET}"


@pytest.fixture
async def failing_ai(
    fresh_db_url: str, amqp_url: str, topology: Topology, fake_ai: FakeAiServer
) -> AsyncIterator[FakeAiServer]:
    engine = create_engine(fresh_db_url, pool_size=5)
    provider = build_provider(
        "openai", base_url=fake_ai.base_url, api_key=API_KEY, timeout_seconds=2
    )
    fake_ai.error_detail = PLANTED
    fake_ai.set_fault("http_400")  # permanent: the job fails on its first try
    try:
        async with worker_and_relay(
            create_session_factory(engine),
            fresh_db_url,
            amqp_url,
            topology,
            build_handlers(provider),
        ):
            yield fake_ai
    finally:
        fake_ai.set_fault(None)
        fake_ai.error_detail = ""
        await provider.aclose()
        await engine.dispose()


def _job_failed_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        {"message": record.getMessage(), **getattr(record, "fields", {})}
        for record in caplog.records
        if record.getMessage() == "job failed"
    ]


async def test_planted_upstream_details_never_reach_the_jobs_owner(
    failing_ai: FakeAiServer,
    fresh_db_url: str,
    amqp_url: str,
    new_user: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    owner = new_user()
    async with api_with(api_settings(fresh_db_url, amqp_url)) as api:
        saved = await save_scrap(api, owner, "a scrap whose analysis the AI refuses")
        job = await settled_job_via_api(api, owner, saved["analysisJobId"])
        shown = (await api.get(f"/async-jobs/{saved['analysisJobId']}", headers=owner)).text

    assert job["status"] == "FAILED"
    summary = job["errorMessage"]
    assert summary and len(summary) <= 300
    assert "400" in summary and "AI call" in summary, summary  # kind, status and which call
    for planted in (HOST, PATH, SECRET, API_KEY, "ai-gateway", "127.0.0.1", failing_ai.origin):
        assert planted not in shown, (planted, shown)

    lines = _job_failed_lines(caplog)
    assert lines, "no 'job failed' log line"
    logged = " ".join(str(line.get("error", "")) for line in lines)
    assert HOST in logged and PATH in logged, logged  # the full chain, for operators
    assert SECRET not in caplog.text and API_KEY not in caplog.text
    assert "[REDACTED]" in logged
