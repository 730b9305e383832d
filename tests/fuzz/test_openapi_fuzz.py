"""Property-based fuzzing of every operation in the API's own OpenAPI description
(schemathesis): whatever a client sends — valid or not — the answer is never a 5xx, and it
is one the description promises: a documented status code, a documented content type and a
body that matches the documented schema (problem+json `Problem` for every error).

The API runs as its own process on the shared test database, GitHub is the loopback fake,
and every request carries a valid bearer token so the generated input reaches the code
behind authentication.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from san_api.auth.tokens import mint
from tests import infra
from tests.conftest import JWT_SECRET, TOKEN_KEYS
from tests.fakes.fake_github import FakeGithub
from tests.procs import start, wait_healthy

pytestmark = pytest.mark.fuzz

EXAMPLES = 25  # per operation and mode: ~2,000 requests in all, new examples each run
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def api_url(db_url: str, amqp_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs: Path = tmp_path_factory.mktemp("fuzz")
    port = infra.free_port()
    with FakeGithub() as github:
        env = {
            "DATABASE_URL": db_url,
            "AMQP_URL": amqp_url,
            "AUTH_JWT_SECRET": JWT_SECRET,
            "TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS,
            "GITHUB_API_URL": github.api_url,
            "GITHUB_OAUTH_URL": github.oauth_url,
            "GITHUB_CLIENT_ID": github.client_id,
            "GITHUB_CLIENT_SECRET": github.client_secret,
            "API_PORT": str(port),
            "SAN_ENV": "test",
            "DATA_DIR": str(logs / "data"),
            # the limits would turn most generated job-creating requests into 429s
            "RATE_LIMIT_JOBS_BURST": "100000",
            "RATE_LIMIT_GITHUB_BURST": "100000",
            "ACTIVE_JOBS_MAX_PER_USER": "100000",
        }
        api = start("api", env, logs)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(base, api)
            yield base
        finally:
            api.terminate()
        assert "Traceback" not in api.log(), api.log()[-5000:]


HEADERS = {"Authorization": f"Bearer {mint(JWT_SECRET, 'fuzz-' + uuid.uuid4().hex)}"}


# Its work grows with the number of operations (25 examples each), not with a stall:
# the suite-wide 120 s is a hang guard for ordinary tests, too tight for a loaded host.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)
def test_every_answer_is_documented_and_none_is_5xx(api_url: str, mode: GenerationMode) -> None:
    """Every operation, with inputs that follow the schema (positive) and inputs that
    break it (negative). Not derandomized: each run draws new examples (hypothesis prints
    the seed of a failure, so it can be replayed)."""
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, "the OpenAPI description lost its operations"
    labels = {operation.label for operation in operations}
    assert {"GET /async-jobs", "DELETE /async-jobs/{jobId}"} <= labels, "a user's own jobs"
    failures: dict[tuple[str, str], str] = {}  # one example per operation and failure kind
    unsatisfiable: list[str] = []
    calls = 0
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def call(case: schemathesis.Case) -> None:
            nonlocal calls
            calls += 1
            try:
                case.call_and_validate(base_url=api_url, headers=HEADERS, checks=CHECKS, timeout=10)
            except Exception as exc:  # a FailureGroup of the checks that failed
                kinds = [type(e).__name__ for e in getattr(exc, "exceptions", [exc])]
                failures[(case.operation.label, ",".join(kinds))] = (
                    f"{case.operation.label}: {exc}\n{case.as_curl_command(headers=HEADERS)}"
                )[:1500]

        try:
            call()
        except Unsatisfiable:
            # nothing to vary (e.g. no parameters at all, in negative mode)
            unsatisfiable.append(operation.label)
    assert len(unsatisfiable) < len(operations) / 2, unsatisfiable
    assert calls >= len(operations) * 5, f"only {calls} requests were made"
    assert not failures, "\n\n".join(failures.values())
