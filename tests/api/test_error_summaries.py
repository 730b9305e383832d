"""Upstream text never reaches a job's owner: an AI call that fails with a body holding a
planted internal host name, file path and secret leaves `GET /async-jobs/{id}` with a short
summary (kind, upstream status, which call) and none of them; the log has the full cause
chain, with the secret redacted.

The same holds for every other user-facing answer that can describe a failure — the TIL and
recall-quiz rows (`errorMessage`), the job's event stream — while the operator's job detail
shows the full chain, redacted (docs/security.md, "Errors"). The GitHub side of this is in
tests/github/test_planted_errors.py."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_api.auth.tokens import mint
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from tests.api.support import api_with, save_scrap
from tests.conftest import JWT_SECRET, api_settings
from tests.fakes.fake_ai import FakeAiServer
from tests.running import worker_and_relay
from tests.til.support import add_card, at_noon, days_ago, make_user
from tests.waiting import settled_job_via_api

pytestmark = pytest.mark.rabbit

HOST = "pg-primary.corp.internal"
PATH = "/srv/san/private/ai-gateway.py"
SECRET = "sk-PLANTEDsecret0123456789"
API_KEY = "sk-test-key-123456"
PLANTED = f" upstream {HOST}:5432 raised at {PATH} line 7, using key {SECRET}"


@pytest.fixture(params=["http_400", "http_500"])
async def failing_ai(
    request: pytest.FixtureRequest,
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fake_ai: FakeAiServer,
) -> AsyncIterator[FakeAiServer]:
    """Every AI call fails: 400 (permanent: the job fails on its first try) or 500 (retried,
    then given up), each with the planted text in the upstream's body."""
    engine = create_engine(fresh_db_url, pool_size=5)
    provider = build_provider(
        "openai", base_url=fake_ai.base_url, api_key=API_KEY, timeout_seconds=2
    )
    fake_ai.error_detail = PLANTED
    fake_ai.set_fault(request.param)
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
    status = "400" if failing_ai.fault == "http_400" else "500"
    assert status in summary and "AI call" in summary, summary  # kind, status and which call
    for planted in (HOST, PATH, SECRET, API_KEY, "ai-gateway", "127.0.0.1", failing_ai.origin):
        assert planted not in shown, (planted, shown)

    lines = _job_failed_lines(caplog)
    assert lines, "no 'job failed' log line"
    logged = " ".join(str(line.get("error", "")) for line in lines)
    assert HOST in logged and PATH in logged, logged  # the full chain, for operators
    assert SECRET not in caplog.text and API_KEY not in caplog.text
    assert "[REDACTED]" in logged


def _planted_in(text: str, ai: FakeAiServer) -> list[str]:
    return [p for p in (HOST, PATH, SECRET, API_KEY, "ai-gateway", ai.origin) if p in text]


async def test_no_user_facing_answer_shows_the_upstream_text_and_the_operator_sees_it_redacted(
    failing_ai: FakeAiServer, fresh_db_url: str, amqp_url: str
) -> None:
    engine = create_engine(fresh_db_url, pool_size=2)
    sessions = create_session_factory(engine)
    day = days_ago(2)
    user = await make_user(sessions)
    await add_card(sessions, user, at_noon(day), title="Event loops")
    operator = {"Authorization": f"Bearer {mint(JWT_SECRET, 'ops', role='operator')}"}
    try:
        async with api_with(api_settings(fresh_db_url, amqp_url)) as api:
            til = await api.post("/til", json={"targetDate": str(day)}, headers=user.headers)
            quiz = await api.post(
                "/recall-quizzes",
                json={"targetDate": str(day), "quizTypes": ["OX"]},
                headers=user.headers,
            )
            assert til.status_code == quiz.status_code == 202, (til.text, quiz.text)
            til_job, quiz_job = til.json()["jobId"], quiz.json()["jobId"]
            for job_id in (til_job, quiz_job):
                assert (await settled_job_via_api(api, user.headers, job_id))["status"] == "FAILED"
            shown = {
                path: await api.get(path, headers=user.headers)
                for path in (
                    f"/async-jobs/{til_job}",
                    f"/async-jobs/{quiz_job}",
                    f"/async-jobs/{til_job}/events",  # the whole stream: the job is final
                    f"/async-jobs/{quiz_job}/events",
                    f"/til/{til.json()['summaryId']}",
                    "/til",
                    f"/recall-quizzes/{quiz.json()['generationId']}",
                )
            }
            detail = (await api.get(f"/admin/api/jobs/{til_job}", headers=operator)).json()
    finally:
        await engine.dispose()

    for path, response in shown.items():
        assert response.status_code == 200, (path, response.text)
        assert not _planted_in(response.text, failing_ai), (path, response.text)
    til_row = shown[f"/til/{til.json()['summaryId']}"].json()
    assert til_row["status"] == "FAILED" and "AI call" in til_row["errorMessage"], til_row
    assert shown[f"/async-jobs/{til_job}/events"].text.count("FAILED") == 1
    # the operator's view: the full chain, with the upstream's text, secrets redacted
    chain = detail["job"]["errorMessage"]
    assert HOST in chain and PATH in chain, detail
    assert SECRET not in chain and API_KEY not in chain and "[REDACTED]" in chain
