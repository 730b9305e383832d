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

from san_common.errors import redact

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "san_log_context", default=None
)
_service = "san"


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
            "msg": redact(record.getMessage()),
            **(_context.get() or {}),
        }
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            line.update({k: v if isinstance(v, int | float | bool) else str(v) for k, v in extra.items()})
        if record.exc_info:
            line["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ctx = {**(_context.get() or {}), **(getattr(record, "fields", None) or {})}
        tail = " ".join(f"{k}={v}" for k, v in ctx.items())
        text = f"{_service:<13} {record.levelname:<7} {redact(record.getMessage())} {tail}".rstrip()
        if record.exc_info:
            text += "\n" + redact(self.formatException(record.exc_info))
        return text


def configure_logging(service: str, *, fmt: str = "json", level: str = "INFO") -> None:
    global _service
    _service = service
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else ConsoleFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Their INFO lines narrate every connection; ours say what matters.
    for noisy in ("aiormq", "aio_pika", "httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
