"""ASGI middleware: request-body size limit, HTTP metrics and the request's trace span."""

from __future__ import annotations

import json
import time

from prometheus_client import Counter, Histogram
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from san_api.errors import ContentTooLarge
from san_common import tracing

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
    inside carry its context in their envelope) and the HTTP metrics. Both are labelled
    with the route template, not the raw path, which keeps label cardinality bounded."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        started = time.perf_counter()
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or []}
        with tracing.span(method, kind="server", parent=headers) as span:
            try:
                await self.app(scope, receive, tracking_send)
            finally:
                route = getattr(scope.get("route"), "path", None)
                HTTP_REQUESTS.labels(method, route or "unmatched", str(status)).inc()
                HTTP_DURATION.labels(method, route or "unmatched").observe(
                    time.perf_counter() - started
                )
                if route is not None:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.request.method", method)
                span.set_attribute("http.response.status_code", status)
