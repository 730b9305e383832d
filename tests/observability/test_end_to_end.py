"""Observability of a real run: API, relay and ai-worker as separate processes, scraps
through them, then their /metrics, their log lines and their exported traces. A user's
first scrap is published by the API itself, the next one while the first is pending by the
relay (docs/architecture.md, "Direct publish"): both paths are observed."""

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


def direct_publish_ready(stack: Stack) -> None:
    """The API's direct publisher is ready (it connects in the background): the next
    user's first scrap is published by the API, not by the relay."""
    api = stack.processes[0]
    wait_until(lambda: "direct publish ready" in api.log(), 30, "the API's direct publisher")


def post_scraps(stack: Stack, subject: str, count: int) -> list[dict[str, Any]]:
    headers = stack.headers(subject)
    bodies = []
    with stack.client() as client:
        for n in range(count):
            response = client.post(
                "/scraps", json={"content": f"Observable scrap {n} of {subject}"}, headers=headers
            )
            assert response.status_code == 202, response.text
            bodies.append(response.json())
    return bodies


def wait_completed(stack: Stack, subject: str, bodies: list[dict[str, Any]]) -> None:
    headers = stack.headers(subject)
    with stack.client() as client:
        for body in bodies:
            for key in ("analysisJobId", "refineJobId"):
                job = stack.wait_job(client, headers, body[key])
                assert job["status"] == "COMPLETED", stack.logs()


def test_metrics_show_real_values_after_an_end_to_end_job(observed_stack: Stack) -> None:
    stack = observed_stack
    _, relay_url = start_probed(stack, "relay")
    direct_publish_ready(stack)
    # no worker yet: the first scrap's jobs are still PENDING when the second registers
    bodies = post_scraps(stack, "metrics-alice", 2)
    _, worker_url = start_probed(stack, "ai-worker")
    wait_completed(stack, "metrics-alice", bodies)

    api = scrape(stack.base_url)
    assert value(api, "san_http_requests_total", method="POST", route="/scraps", status="202") == 2
    assert (
        value(api, "san_http_request_duration_seconds_count", method="POST", route="/scraps") == 2
    )
    for job_type in JOB_TYPES:
        assert value(api, "san_jobs_registered_total", job_type=job_type) == 2
    # the first scrap's two messages by the API, the second's two by the relay
    assert value(api, "san_outbox_direct_published_total") == 2
    assert value(api, "san_outbox_direct_fallbacks_total") == 0

    worker = scrape(worker_url)
    for job_type in JOB_TYPES:
        assert value(worker, "san_jobs_finished_total", job_type=job_type, outcome="completed") == 2
        assert value(worker, "san_jobs_finished_total", job_type=job_type, outcome="failed") == 0
        assert value(worker, "san_job_duration_seconds_count", job_type=job_type) == 2
        assert value(worker, "san_job_duration_seconds_sum", job_type=job_type) > 0
        assert value(worker, "san_job_queue_wait_seconds_count", job_type=job_type) == 2
        assert value(worker, "san_job_queue_wait_seconds_sum", job_type=job_type) > 0
        assert value(worker, "san_job_retries_total", job_type=job_type) == 0
    assert value(worker, "san_messages_dead_lettered_total", reason="unreadable") == 0

    relay = scrape(relay_url)
    assert value(relay, "san_outbox_published_total") == 2
    assert value(relay, "san_outbox_publish_lag_seconds_count") == 2
    assert value(relay, "san_outbox_publish_lag_seconds_sum") > 0
    card_queue = Topology(stack.env["AMQP_PREFIX"]).queue_name(JobType.CARD_ANALYSIS)
    depth = ("san_queue_messages_ready", frozenset({("queue", card_queue)}))
    # the relay measures the outbox and the queues every few seconds, not only at cleanup;
    # a reading taken while a message still waited for the worker holds until the next
    wait_until(lambda: scrape(relay_url).get(depth) == 0, 30, "the relay's queue depth gauges at 0")
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
    direct_publish_ready(stack)
    # the first scrap published by the API, the second (the first still pending: no worker
    # yet) by the relay
    direct, relayed = post_scraps(stack, "logs-bob", 2)
    start_probed(stack, "ai-worker")
    wait_completed(stack, "logs-bob", [direct, relayed])
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

    jobs = {b[k]: b for b in (direct, relayed) for k in ("analysisJobId", "refineJobId")}
    assert {line["job_id"] for line in job_lines} == set(jobs)
    for line in job_lines:
        assert {"job_id", "job_type", "message_id", "trace_id"} <= set(line), line
    # one trace per request: the worker's lines carry the trace id of the API request
    traces = {}
    for body in (direct, relayed):
        [traces[id(body)]] = {
            line["trace_id"]
            for line in job_lines
            if line["job_id"] in (body["analysisJobId"], body["refineJobId"])
        }
    direct_trace, relayed_trace = traces[id(direct)], traces[id(relayed)]
    assert direct_trace != relayed_trace

    def services(trace_id: str) -> set[str]:
        return {s.service for s in collector.spans if s.trace_id == trace_id}

    def whole_traces_exported() -> bool:
        # the API published the first scrap's messages itself; the relay the second's
        return services(direct_trace) == {"api", "ai-worker"} and services(relayed_trace) == {
            "api",
            "relay",
            "ai-worker",
        }

    wait_until(whole_traces_exported, 10, "the spans of api, (relay) and ai-worker")
    for trace_id in (direct_trace, relayed_trace):
        [root] = [s for s in collector.spans if s.trace_id == trace_id and not s.parent_id]
        assert (root.service, root.name) == ("api", "POST /scraps")
    assert any(
        s.trace_id == direct_trace and s.service == "api" and s.name.startswith("publish ")
        for s in collector.spans
    ), "the API's publish span continues the request's trace"
