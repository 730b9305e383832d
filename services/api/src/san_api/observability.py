"""What the edge (san_api.edge) records of every request: its request id, a server span,
the HTTP metrics and one access-log line. All are labelled with the route template, not
the raw path, which keeps label cardinality bounded and ids out of the metric names."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable

from opentelemetry.trace import Span
from prometheus_client import Counter, Histogram
from starlette.types import Scope

from san_common import tracing

access_log = logging.getLogger("san_api.access")

HTTP_REQUESTS = Counter("san_http_requests_total", "HTTP requests", ["method", "route", "status"])
HTTP_DURATION = Histogram(
    "san_http_request_duration_seconds", "HTTP request latency", ["method", "route"]
)

# A caller's request id is kept when it is a plain token of sane length, else replaced.
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")


def request_id(given: bytes) -> str:
    """The caller's `X-Request-ID` when it is a sane token, else a new one."""
    # a uuid4's 32 hex digits, without building the UUID
    return given.decode() if _REQUEST_ID.fullmatch(given) else os.urandom(16).hex()


def trace_carrier(raw_headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str] | None:
    """The request's headers as a carrier for the span's parent; None when tracing is off
    (the span ignores it then, and decoding every header of every request costs)."""
    if not tracing.enabled():
        return None
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}


def record(scope: Scope, span: Span, status: int, elapsed: float) -> None:
    """A request's end: its metrics, its span's name and attributes, its access-log line."""
    method = scope["method"]
    route = getattr(scope.get("route"), "path", None)
    requests, duration = _series(method, route or "unmatched", status)
    requests.inc()
    duration.observe(elapsed)
    if span.is_recording():
        if route is not None:
            span.update_name(f"{method} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.request.method", method)
        span.set_attribute("http.response.status_code", status)
    _access_line(method, route, scope.get("path", ""), status, elapsed)


# The metric children by (method, route, status): `labels()` costs a lock and a tuple of
# strings per call, on every request. Routes are templates, so the set stays small.
_SERIES: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}


def _series(method: str, route: str, status: int) -> tuple[Counter, Histogram]:
    found = _SERIES.get((method, route, status))
    if found is None:
        found = (
            HTTP_REQUESTS.labels(method, route, str(status)),
            HTTP_DURATION.labels(method, route),
        )
        _SERIES[(method, route, status)] = found
    return found


# A kubelet probing every few seconds would drown the access log: these go at DEBUG.
_PROBE_ROUTES = frozenset({"/healthz", "/readyz", "/metrics"})


def _access_line(method: str, route: str | None, path: str, status: int, elapsed: float) -> None:
    fields: dict[str, object] = {
        "method": method,
        "route": route or "unmatched",
        "status": status,
        "duration_ms": round(elapsed * 1000, 1),
    }
    if route is None:  # no template to show: the path, bounded
        fields["path"] = path[:200]
    level = logging.DEBUG if route in _PROBE_ROUTES else logging.INFO
    if not access_log.isEnabledFor(level):
        return
    # made and handled as `log()` would, less the search of the stack for the caller's
    # file and line, which no access line shows
    args = (method, route or "unmatched", status)
    line = access_log.makeRecord(
        access_log.name, level, "", 0, "%s %s %s", args, None, extra={"fields": fields}
    )
    access_log.handle(line)
