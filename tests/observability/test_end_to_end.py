"""Observability of a real run: API, relay and ai-worker as separate processes, one scrap
through them, then their /metrics, their log lines and their exported traces."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from san_common.broker.topology import Topology
from san_common.jobs.types import JobType
from tests.deploy.services import looks_secret
from tests.e2e.conftest import Stack
from tests.observability.conftest import start_probed
from tests.observability.fake_collector import FakeCollector
from tests.procs import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]

JOB_TYPES = ("CARD_ANALYSIS", "SCRAP_REFINE")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base_url: str) -> Samples:
    response = httpx.get(f"{base_url}/metrics", timeout=5)
    assert response.status_code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"no sample {name}{labels}"
    return samples[key]


def one_scrap_through(stack: Stack, subject: str) -> dict[str, Any]:
    headers = stack.headers(subject)
    with stack.client() as client:
        response = client.post(
            "/scraps", json={"content": f"Observable scrap of {subject}"}, headers=headers
        )
        assert response.status_code == 202, response.text
        body: dict[str, Any] = response.json()
        for key in ("analysisJobId", "refineJobId"):
            assert stack.wait_job(client, headers, body[key])["status"] == "COMPLETED", stack.logs()
    return body


def test_metrics_show_real_values_after_an_end_to_end_job(observed_stack: Stack) -> None:
    stack = observed_stack
    _, relay_url = start_probed(stack, "relay")
    _, worker_url = start_probed(stack, "ai-worker")
    one_scrap_through(stack, "metrics-alice")

    api = scrape(stack.base_url)
    assert value(api, "san_http_requests_total", method="POST", route="/scraps", status="202") == 1
    assert (
        value(api, "san_http_request_duration_seconds_count", method="POST", route="/scraps") == 1
    )
    for job_type in JOB_TYPES:
        assert value(api, "san_jobs_registered_total", job_type=job_type) == 1

    worker = scrape(worker_url)
    for job_type in JOB_TYPES:
        assert value(worker, "san_jobs_finished_total", job_type=job_type, outcome="completed") == 1
        assert value(worker, "san_jobs_finished_total", job_type=job_type, outcome="failed") == 0
        assert value(worker, "san_job_duration_seconds_count", job_type=job_type) == 1
        assert value(worker, "san_job_duration_seconds_sum", job_type=job_type) > 0
        assert value(worker, "san_job_queue_wait_seconds_count", job_type=job_type) == 1
        assert value(worker, "san_job_queue_wait_seconds_sum", job_type=job_type) > 0
        assert value(worker, "san_job_retries_total", job_type=job_type) == 0
    assert value(worker, "san_messages_dead_lettered_total", reason="unreadable") == 0

    relay = scrape(relay_url)
    assert value(relay, "san_outbox_published_total") == 2
    assert value(relay, "san_outbox_publish_lag_seconds_count") == 2
    assert value(relay, "san_outbox_publish_lag_seconds_sum") > 0
    card_queue = Topology(stack.env["AMQP_PREFIX"]).queue_name(JobType.CARD_ANALYSIS)
    depth = ("san_queue_messages_ready", frozenset({("queue", card_queue)}))
    # the relay measures the outbox and the queues every few seconds, not only at cleanup
    wait_until(lambda: depth in scrape(relay_url), 30, "the relay's queue depth gauges")
    relay = scrape(relay_url)
    assert value(relay, "san_outbox_backlog") == 0
    assert value(relay, "san_queue_messages_ready", queue=card_queue) == 0


def known_secrets(stack: Stack) -> list[str]:
    """Every secret of the run: secret-looking variables, passwords in URLs, and the secrets
    the processes generated into the data directory."""
    found = [
        v
        for k, v in stack.env.items()
        if looks_secret(k) and not v.startswith(("postgresql:", "amqp:"))
    ]
    found += [p for v in stack.env.values() if "://" in v and (p := urlsplit(v).password)]
    secrets_dir = Path(stack.env["DATA_DIR"]) / "secrets"
    if secrets_dir.exists():
        found += [path.read_text().strip() for path in secrets_dir.iterdir()]
    # a short one ("guest") would match ordinary words
    return [secret for secret in found if len(secret) >= 8]


def test_logs_are_json_lines_with_job_context_and_no_secrets(
    observed_stack: Stack, collector: FakeCollector
) -> None:
    stack = observed_stack
    start_probed(stack, "relay")
    start_probed(stack, "ai-worker")
    body = one_scrap_through(stack, "logs-bob")
    for process in reversed(stack.processes):  # a clean stop flushes logs and spans
        # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly
        clean = (0, -signal.SIGTERM) if process.name == "api" else (0,)
        assert process.terminate() in clean, process.log()

    secrets = known_secrets(stack)
    assert {
        stack.env["AUTH_JWT_SECRET"],
        stack.env["TOKEN_ENCRYPTION_KEYS"],
        stack.env["AI_API_KEY"],
    } <= set(secrets)
    job_lines = []
    for process in stack.processes:
        for raw in process.log().splitlines():
            if not raw.strip():
                continue
            line = json.loads(raw)  # every line, of every process, is one JSON object
            assert {"ts", "level", "service", "msg"} <= set(line), raw
            assert line["service"] == process.name, raw
            leaked = [s for s in secrets if s in raw]
            assert not leaked, f"{process.name} logged a secret: {raw}"
            if line["msg"] in ("job claimed", "job completed"):
                job_lines.append(line)

    assert {line["job_id"] for line in job_lines} == {body["analysisJobId"], body["refineJobId"]}
    for line in job_lines:
        assert {"job_id", "job_type", "message_id", "trace_id"} <= set(line), line
    # one trace per request: the worker's lines carry the trace id of the API request
    [trace_id] = {line["trace_id"] for line in job_lines}

    def whole_trace_exported() -> bool:
        return {s.service for s in collector.spans if s.trace_id == trace_id} == {
            "api",
            "relay",
            "ai-worker",
        }

    wait_until(whole_trace_exported, 10, "the spans of api, relay and ai-worker")
    [root] = [s for s in collector.spans if s.trace_id == trace_id and not s.parent_id]
    assert (root.service, root.name) == ("api", "POST /scraps")
