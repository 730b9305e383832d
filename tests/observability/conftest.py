"""The end-to-end stack of tests/e2e with tracing on, exporting to a fake OTLP collector,
and secrets of every kind set, so that the logs can be searched for them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TOKEN_KEYS
from tests.e2e.conftest import Stack
from tests.e2e.conftest import stack_env as stack_env  # the base environment, a fixture
from tests.infra import free_port
from tests.observability.fake_collector import FakeCollector
from tests.procs import ServiceProcess, wait_healthy

# Distinctive values, so that finding one in a log line cannot be a coincidence.
AI_API_KEY = "sk-observability-test-key-5b0c7e"
GITHUB_CLIENT_SECRET = "gh-client-secret-observability-91d2"


@pytest.fixture
def collector() -> Iterator[FakeCollector]:
    with FakeCollector() as collector:
        yield collector


@pytest.fixture
def observed_stack(
    stack_env: dict[str, str],
    collector: FakeCollector,
    tmp_path: Path,
) -> Iterator[Stack]:
    """An API process with tracing on; tests start the rest with `start_probed`."""
    stack_env.update(
        TRACING_ENABLED="true",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="100",  # export every 0.1 s, not every 5 s
        TOKEN_ENCRYPTION_KEYS=TOKEN_KEYS,
        AI_API_KEY=AI_API_KEY,
        GITHUB_CLIENT_SECRET=GITHUB_CLIENT_SECRET,
    )
    stack = Stack(stack_env, tmp_path, f"http://127.0.0.1:{stack_env['API_PORT']}", [])
    api = stack.start("api")
    try:
        wait_healthy(stack.base_url, api)
        yield stack
    finally:
        for process in reversed(stack.processes):
            process.terminate()


def start_probed(stack: Stack, name: str) -> tuple[ServiceProcess, str]:
    """Start a non-HTTP service with its probe server on a known port; returns its base URL."""
    port = free_port()
    stack.env["PROBE_PORT"] = str(port)
    process = stack.start(name)
    base_url = f"http://127.0.0.1:{port}"
    wait_healthy(base_url, process)
    return process, base_url
