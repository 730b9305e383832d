"""ASGI middleware: request-body size limit; HTTP metrics, trace span, request id and
access log."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterable

from prometheus_client import Counter, Histogram
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from san_api.errors import ContentTooLarge
from san_common import tracing
from san_common.logs import log_context

access_log = logging.getLogger("san_api.access")

HTTP_REQUESTS = Counter("san_http_requests_total", "HTTP requests", ["method", "route", "status"])
HTTP_DURATION = Histogram(
    "san_http_request_duration_seconds", "HTTP request latency", ["method", "route"]
)


class _TooLarge(HTTPException):
    """An HTTPException so that FastAPI's body reader re-raises it as is (it turns any other
    exception raised while reading into a 400) and the problem+json handler renders a 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request bodies are limited to {max_bytes} bytes")


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413 before they reach validation or memory."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(scope, send)

    async def _reject(self, scope: Scope, send: Send) -> None:
        body = json.dumps(
            {
                "type": "https://san.example/problems/content-too-large",
                "title": ContentTooLarge.title,
                "status": 413,
                "detail": f"request bodies are limited to {self.max_bytes} bytes",
                "code": "CONTENT_TOO_LARGE",
                "instance": scope.get("path", ""),
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class ObservabilityMiddleware:
    """Per request: a server span (continuing the caller's `traceparent`, so jobs registered
    inside carry its context in their envelope), the HTTP metrics, a request id and one
    access-log line. All are labelled with the route template, not the raw path, which keeps
    label cardinality bounded and ids out of the metric names.

    The request id is the caller's `X-Request-ID` when it is a sane token, else a new one;
    it is echoed in the response and bound to every log line of the request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        started = time.perf_counter()
        status = 500
        raw_headers = scope.get("headers") or ()
        given = next((v for k, v in raw_headers if k == b"x-request-id"), b"")
        request_id = given.decode() if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        request_id_header = (b"x-request-id", request_id.encode())

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), request_id_header]
                message = {**message, "headers": headers}
            await send(message)

        with (
            log_context(request_id=request_id),
            tracing.span(method, kind="server", parent=_trace_carrier(raw_headers)) as span,
        ):
            try:
                await self.app(scope, receive, tracking_send)
            finally:
                elapsed = time.perf_counter() - started
                route = getattr(scope.get("route"), "path", None)
                requests, duration = _series(method, route or "unmatched", status)
                requests.inc()
                duration.observe(elapsed)
                if route is not None:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.request.method", method)
                span.set_attribute("http.response.status_code", status)
                _access_line(method, route, scope.get("path", ""), status, elapsed)


# A caller's request id is kept when it is a plain token of sane length, else replaced.
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")

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


def _trace_carrier(raw_headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str] | None:
    """The request's headers as a carrier for the span's parent; None when tracing is off
    (the span ignores it then, and decoding every header of every request costs)."""
    if not tracing.enabled():
        return None
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}


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
    access_log.log(
        level, "%s %s %s", method, route or "unmatched", status, extra={"fields": fields}
    )
