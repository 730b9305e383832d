"""Structured logging: JSON lines (default) or a readable console format for local runs.

Job context (`job_id`, `job_type`, `message_id`, `trace_id`) is bound with `log_context`
and added to every line logged inside it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
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
# json.dumps(…, ensure_ascii=False)'s encoder, made once; a line's fields are fresh values
# built by `_json_field`, never a cycle, so the cycle check is spared.
_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False)
_PLAIN = frozenset({int, float, bool})
_ts_second = -1  # the second `_ts_prefix` formats
_ts_prefix = ""


def log_context(**fields: Any) -> _Bound:
    """`with log_context(job_id=…):` every line logged in the block carries the fields."""
    return _Bound({k: str(v) for k, v in fields.items() if v is not None})


class _Bound:
    """A class rather than a generator: the API enters one per request, a worker per job."""

    __slots__ = ("_fields", "_token")

    def __init__(self, fields: dict[str, str]) -> None:
        self._fields = fields

    def __enter__(self) -> None:
        self._token = _context.set({**(_context.get() or {}), **self._fields})

    def __exit__(self, *exc_info: object) -> None:
        _context.reset(self._token)


class JsonFormatter(logging.Formatter):
    """One JSON object per line. A worker writes one per job, so the line is built cheaply:
    the timestamp's seconds are formatted once per second, one encoder serves every line,
    and the secret patterns run once over all of a line's text (one `redact` call instead
    of one per field); only a line that holds something to hide is redacted field by field.
    """

    def format(self, record: logging.LogRecord) -> str:
        texts: list[str] = []
        msg = record.getMessage()
        texts.append(msg)
        line: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "service": _service,
            "logger": record.name,
            "msg": msg,
            **_bound(),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            line.update({k: _json_field(v, texts) for k, v in extra.items()})
        # Whatever `redact` would change in one text it changes in the texts joined (the
        # patterns match no newline at their edges), so an unchanged join clears them all.
        joined = "\n".join(texts)
        if _redact(joined) != joined:
            line["msg"] = _redact(msg)
            if isinstance(extra, dict):
                line.update({k: _redacted_field(v) for k, v in extra.items()})
        if record.exc_info:
            line["exc"] = _redact(self.formatException(record.exc_info))
        return _ENCODER.encode(line)


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


def _json_field(value: Any, texts: list[str]) -> Any:
    """Numbers and booleans as they are, lists and mappings as JSON structures, anything
    else as its text, which is added to `texts` (what the line must have redacted)."""
    kind = type(value)
    if kind is str:
        texts.append(value)
        return value
    if kind in _PLAIN or value is None or isinstance(value, int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _json_field(v, texts) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_field(v, texts) for v in value]
    text = str(value)
    texts.append(text)
    return text


def _redacted_field(value: Any) -> Any:
    """`_json_field` with every text redacted."""
    if value is None or isinstance(value, int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _redacted_field(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted_field(v) for v in value]
    return _redact(str(value))


def _timestamp(created: float) -> str:
    """`datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")` (the same
    half-even rounding to the microsecond), its seconds formatted once per second."""
    global _ts_second, _ts_prefix
    second = int(created)
    micros = round((created - second) * 1_000_000)
    if micros >= 1_000_000:
        second, micros = second + 1, micros - 1_000_000
    if second != _ts_second:
        _ts_second = second
        _ts_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_ts_prefix}.{micros // 1000:03d}+00:00"


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
    # No format here prints a thread or process name; a record skips looking them up.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
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
