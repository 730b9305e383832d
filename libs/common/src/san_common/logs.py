"""Structured logging: JSON lines (default) or a readable console format for local runs.

Job context (`job_id`, `job_type`, `message_id`, `trace_id`) is bound with `log_context`
and added to every line logged inside it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic_settings import BaseSettings

from san_common.errors import redact
from san_common.settings import ServiceSettings
from san_common.tracing import current_trace_id

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "san_log_context", default=None
)
_service = "san"
# Exact values (JWT secret, API keys, passwords) that must never reach a log line; the
# patterns in `redact` catch tokens by shape, these catch secrets of any shape.
_secrets: tuple[str, ...] = ()
_SECRET_FIELD_HINTS = ("secret", "password", "token", "api_key", "encryption_key")


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    merged = {**(_context.get() or {}), **{k: str(v) for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": _service,
            "logger": record.name,
            "msg": _redact(record.getMessage()),
            **_bound(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            line.update({k: _json_field(v) for k, v in extra.items()})
        if record.exc_info:
            line["exc"] = _redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ctx = {**_bound(), **(getattr(record, "fields", None) or {})}
        tail = " ".join(f"{k}={v}" for k, v in ctx.items())
        text = _redact(
            f"{_service:<13} {record.levelname:<7} {record.getMessage()} {tail}".rstrip()
        )
        if record.exc_info:
            text += "\n" + _redact(self.formatException(record.exc_info))
        return text


def _json_field(value: Any) -> Any:
    """Numbers and booleans as they are, lists and mappings as JSON structures (their
    strings redacted), anything else as its redacted text."""
    if value is None or isinstance(value, int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _json_field(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_field(v) for v in value]
    return _redact(str(value))


def _bound() -> dict[str, Any]:
    """The bound job context, plus the current trace id when a span is active."""
    fields = _context.get() or {}
    if "trace_id" not in fields and (trace_id := current_trace_id()):
        return {**fields, "trace_id": trace_id}
    return fields


def _redact(text: str) -> str:
    return redact(text, _secrets)


def secret_values(settings: BaseSettings) -> tuple[str, ...]:
    """The values of a settings object's secret-looking fields and the passwords inside its
    URLs: what `configure_logging` must keep out of every line."""
    found: list[str] = []
    for name, value in settings.model_dump().items():
        if not isinstance(value, str) or not value:
            continue
        if any(hint in name for hint in _SECRET_FIELD_HINTS):
            found.extend(part.strip() for part in value.split(","))
        elif "://" in value and (password := urlsplit(value).password):
            found.append(unquote(password))
    # a short value (a default "guest") would redact ordinary words
    return tuple(sorted({s for s in found if len(s) >= 8}, key=len, reverse=True))


def configure_logging(
    service: str, *, fmt: str = "json", level: str = "INFO", secrets: tuple[str, ...] = ()
) -> None:
    global _service, _secrets
    _service = service
    _secrets = secrets
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Their INFO lines narrate every connection; ours say what matters.
    for noisy in ("aiormq", "aio_pika", "httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Python warnings become log lines too, so stderr carries nothing but the chosen format.
    logging.captureWarnings(True)


def configure_service_logging(settings: ServiceSettings) -> None:
    """Logging of a service process: its name, format, level, and its own secrets redacted."""
    configure_logging(
        settings.service_name,
        fmt=settings.log_format,
        level=settings.log_level,
        secrets=secret_values(settings),
    )
    for name, suggestion in settings.unknown_variables():
        logging.getLogger("san_common.settings").warning(
            "unknown setting ignored",
            extra={"fields": {"variable": name, "did_you_mean": suggestion or "-"}},
        )
