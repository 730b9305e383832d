"""Trace-context propagation. OpenTelemetry is optional: without it, nothing is carried."""

from __future__ import annotations

from collections.abc import Mapping


def current_trace_context() -> dict[str, str]:
    """The W3C `traceparent`/`tracestate` of the current span, if tracing is active."""
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


def context_from(carrier: Mapping[str, str | None]) -> object | None:
    """An OpenTelemetry context extracted from an envelope, or None without tracing."""
    try:
        from opentelemetry.propagate import extract
    except ImportError:
        return None
    return extract({k: v for k, v in carrier.items() if v})
