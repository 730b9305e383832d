"""Log lines: JSON with the job and trace context, no secrets of any shape, a console format."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from san_common import logs, tracing
from san_common.settings import ServiceSettings
from san_relay.settings import RelaySettings

JWT_LIKE = "a-jwt-secret-of-any-shape-0123456789abcdef"


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """configure_logging's handler writes here; pytest's own logging is restored after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield io.StringIO()
    logs.configure_logging("san")  # forget this test's service name and secrets
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


def configure(stream: io.StringIO, fmt: str, secrets: tuple[str, ...] = ()) -> None:
    logs.configure_logging("test-service", fmt=fmt, level="INFO", secrets=secrets)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    """The JSON lines this test's logger wrote."""
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in parsed if line["logger"] == "test"]


def test_secret_values_are_the_secret_fields_and_the_url_passwords() -> None:
    settings = RelaySettings(
        database_url="postgresql://san:db-password-123456@db:5432/san",
        amqp_url="amqp://guest:guest@broker:5672/",
        san_env="test",
    )
    assert logs.secret_values(settings) == ("db-password-123456",)  # "guest" is too short to redact

    class WithSecrets(ServiceSettings):  # type: ignore[misc]
        auth_jwt_secret: str = ""
        token_encryption_keys: str = ""

    many = WithSecrets(
        auth_jwt_secret=JWT_LIKE, token_encryption_keys="first-key-0123456789,second-key-0123456789"
    )
    assert set(logs.secret_values(many)) == {
        JWT_LIKE,
        "first-key-0123456789",
        "second-key-0123456789",
    }


def test_json_lines_carry_the_job_context_and_never_a_secret(captured: io.StringIO) -> None:
    configure(captured, "json", secrets=(JWT_LIKE,))
    log = logging.getLogger("test")
    with logs.log_context(job_id="j-1", job_type="CARD_ANALYSIS", message_id="m-1"):
        log.info(
            "signed with %s", JWT_LIKE, extra={"fields": {"detail": f"secret={JWT_LIKE}", "n": 3}}
        )
        try:
            raise RuntimeError(f"boom {JWT_LIKE}")
        except RuntimeError:
            log.exception("failed")
    log.info("outside any job")
    first, second, third = lines(captured)
    assert first["service"] == "test-service"
    assert (first["job_id"], first["job_type"], first["message_id"]) == (
        "j-1",
        "CARD_ANALYSIS",
        "m-1",
    )
    assert first["n"] == 3
    assert "job_id" not in third
    assert JWT_LIKE not in captured.getvalue()
    assert "[REDACTED]" in str(first["msg"]) and "[REDACTED]" in str(second["exc"])


def test_a_line_inside_a_span_carries_its_trace_id(captured: io.StringIO) -> None:
    configure(captured, "json")
    logging.getLogger("test").info("before tracing")
    assert tracing.configure_tracing(
        ServiceSettings(), exporter=InMemorySpanExporter(), batch=False
    )
    try:
        with tracing.span("work"):
            trace_id = tracing.current_trace_id()
            logging.getLogger("test").info("inside a span")
    finally:
        tracing.shutdown_tracing()
    before, inside = lines(captured)
    assert "trace_id" not in before
    assert trace_id is not None and inside["trace_id"] == trace_id


def test_the_console_format_is_one_readable_line(captured: io.StringIO) -> None:
    configure(captured, "console", secrets=(JWT_LIKE,))
    with logs.log_context(job_id="j-2"):
        logging.getLogger("test").warning("retrying %s", JWT_LIKE, extra={"fields": {"try": 2}})
    [line] = captured.getvalue().splitlines()
    assert line.startswith("test-service") and "WARNING" in line
    assert "job_id=j-2" in line and "try=2" in line
    assert JWT_LIKE not in line


def test_structured_fields_stay_structures_in_a_json_line() -> None:
    """`san-recovery run --json` logs `by_job_type` as an object, not a JSON string."""
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "sweep", None, None)
    record.fields = {"by_job_type": {"CARD_ANALYSIS": {"found": 2}}, "names": ["a", "b"]}
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["by_job_type"] == {"CARD_ANALYSIS": {"found": 2}}
    assert line["names"] == ["a", "b"]


SHAPED = {  # one secret of each shape `errors.redact` knows, in the cases a caller writes
    "github": ("", "ghp_a1B2c3D4e5F6g7H8"),
    "github_pat": ("", "github_pat_11ABCDEFG0123456789_xyz"),
    "bearer": ("BEARER ", "eyJhbGciOiJIUzI1NiJ9"),
    "token": ("Token ", "abcdef0123456789"),
    "query": ("https://x/y?API_KEY=", "k-0123456789"),
    "openai": ("", "sk-proj-0123456789abcdef"),
}


@pytest.mark.parametrize("shape", sorted(SHAPED))
def test_a_secret_of_any_shape_is_redacted_wherever_it_sits_in_a_json_line(shape: str) -> None:
    """The formatter clears a whole line's texts at once; a secret in the message, a field
    or a nested field is still caught, and the line's clean texts are left as they were."""
    prefix, secret = SHAPED[shape]
    for fields in ({}, {"detail": prefix + secret}, {"calls": [{"url": prefix + secret}]}):
        msg, args = ("job completed", None) if fields else ("calling %s", (prefix + secret,))
        record = logging.LogRecord("t", logging.INFO, __file__, 1, msg, args, None)
        record.fields = {**fields, "outcome": "completed", "at": "2026-01-01T00:00:00+00:00"}
        text = logs.JsonFormatter().format(record)
        line = json.loads(text)
        assert secret not in text and "[REDACTED]" in text, (shape, fields)
        assert line["outcome"] == "completed" and line["at"] == "2026-01-01T00:00:00+00:00"
        assert line["msg"] == "job completed" if fields else "calling" in str(line["msg"])
