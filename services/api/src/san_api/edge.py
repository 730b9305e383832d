"""The HTTP edge: what the server accepts, what every answer carries and what is recorded
of every request (docs/security.md).

- `server_options(settings)`: uvicorn with the httptools parser and a limit on a request's
  head (`HTTP_MAX_HEADER_BYTES`; httptools itself has none), a time limit on receiving a
  request's headers (`HTTP_HEADER_TIMEOUT_SECONDS`, which also closes a
  connection that never sends a request; both in `san_common.compat`: they subclass
  uvicorn's protocol), a cap on open connections (`HTTP_MAX_CONNECTIONS`) that spares the
  health and readiness probes, and no `server` banner.
- `EdgeMiddleware`, the API's one ASGI middleware, for every request:
  - its request id, server span, HTTP metrics and access-log line (san_api.observability),
    around everything below, refusals included;
  - beyond the connection cap: 503 problem+json with `Retry-After`, connection closed;
  - a cross-origin console request: 403 (san_api.admin.csrf);
  - a body over `REQUEST_MAX_BYTES`, declared or sent: 413, before it reaches validation
    or memory;
  - a body that has not arrived within `HTTP_BODY_TIMEOUT_SECONDS` of the request's start,
    whatever pace it drips at: 408, connection closed;
  - on every answer: nosniff, no referrer, no framing, `Cache-Control: no-store` unless a
    route chose its own, a CSP (pages: own scripts only; anything else: none), and the
    request id;
  - an unexpected exception becomes a 500 problem (a lost database a 503 with
    `Retry-After`) *answered here*, so the connection stays usable; Starlette's own
    last-resort handler re-raises, which makes uvicorn drop the connection.

One layer rather than one per concern: every layer costs each request a call and two
wrapped sends, and seven of them were a sixth of `POST /scraps`' CPU (docs/hot-paths.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from san_api import observability
from san_api.errors import PROBLEM_JSON, ContentTooLarge, database_unavailable
from san_api.health import PROBE_PATHS
from san_api.settings import ApiSettings
from san_common import tracing
from san_common.compat import OVER_CAPACITY, head_limited_httptools
from san_common.logs import log_context
from san_common.outages import DATABASE

if TYPE_CHECKING:
    from san_api.admin.csrf import ConsoleCsrf

log = logging.getLogger(__name__)

PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self'; connect-src 'self'; worker-src 'self' blob:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
DATA_CSP = "default-src 'none'; frame-ancestors 'none'"
_ALWAYS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


def server_options(settings: ApiSettings) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.run` / `uvicorn.Config` (the API's edge limits)."""
    return {
        "http": head_limited_httptools(
            settings.http_header_timeout_seconds,
            settings.http_max_header_bytes,
            max_connections=settings.http_max_connections,
            exempt_paths=PROBE_PATHS,
        ),
        "limit_concurrency": None,  # the protocol's cap instead: it spares the probes
        "timeout_keep_alive": settings.http_keep_alive_seconds,
        # the client's address and scheme come from these proxies' X-Forwarded-* headers
        "proxy_headers": True,
        "forwarded_allow_ips": settings.api_forwarded_allow_ips,
        "server_header": False,
        "ws": "none",
    }


class _TooLarge(HTTPException):
    """An HTTPException so that FastAPI's body reader re-raises it as is (it turns any other
    exception raised while reading into a 400) and the problem+json handler renders a 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request bodies are limited to {max_bytes} bytes")


class _BodyTooSlow(HTTPException):
    """An HTTPException so that FastAPI's body reader re-raises it as is."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {seconds:g} seconds",
            headers={"Connection": "close"},
        )


BUSY_RETRY_AFTER_SECONDS = 2


class EdgeMiddleware:
    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, body_seconds: float, csrf: ConsoleCsrf
    ) -> None:
        self.app = app
        self.max_body_bytes, self.body_seconds, self.csrf = max_body_bytes, body_seconds, csrf

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        raw_headers = scope.get("headers") or ()
        given_id, declared = b"", b""
        for name, value in raw_headers:
            if name == b"x-request-id":
                given_id = value
            elif name == b"content-length":
                declared = value
        request_id = observability.request_id(given_id)
        exchange = _Exchange(
            receive,
            send,
            request_id.encode(),
            self.max_body_bytes,
            self.body_seconds,
        )
        with (
            log_context(request_id=request_id),
            tracing.span(
                scope["method"], kind="server", parent=observability.trace_carrier(raw_headers)
            ) as span,
        ):
            try:
                await self._answer(scope, exchange, declared)
            finally:
                observability.record(scope, span, exchange.status, time.perf_counter() - started)

    async def _answer(self, scope: Scope, exchange: _Exchange, declared: bytes) -> None:
        """Refused, in order: beyond the connection cap, a body declared too large, a
        cross-origin console request; else the app's answer, or the edge's for what it
        raised."""
        send = exchange.send
        if scope.get(OVER_CAPACITY):
            log.warning("connection cap reached: %s refused", scope.get("path", ""))
            await send_problem(
                send,
                scope,
                503,
                "SERVER_BUSY",
                "the server has too many open connections; retry shortly",
                headers=[(b"retry-after", str(BUSY_RETRY_AFTER_SECONDS).encode())],
                close=True,
                title="The server is busy; retry later",
            )
            return
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _too_large(send, scope, self.max_body_bytes)
            return
        if self.csrf.refused(scope):
            await self.csrf.refuse(send, scope)
            return
        try:
            await self.app(scope, exchange.receive, send)
        except _TooLarge:
            if not exchange.started:
                await _too_large(send, scope, self.max_body_bytes)
        except _BodyTooSlow as exc:
            if not exchange.started:
                await send_problem(send, scope, 408, "REQUEST_TIMEOUT", str(exc.detail), close=True)
        except Exception as exc:
            if exchange.started:
                raise  # a half-sent answer cannot be mended; uvicorn closes the connection
            unavailable = database_unavailable(exc)
            if unavailable is not None:
                DATABASE.lost(exc, f"{scope.get('method')} {scope.get('path')}")
                await send_problem(
                    send,
                    scope,
                    503,
                    "DATABASE_UNAVAILABLE",
                    unavailable,
                    headers=[(b"retry-after", b"5")],
                )
                return
            log.exception("unhandled error")
            await send_problem(send, scope, 500, "INTERNAL_ERROR", "An unexpected error occurred")


class _Exchange:
    """One request's way through the edge: the body it receives, bounded in size and time,
    and the answer it sends, with the headers every answer carries."""

    __slots__ = (
        "_complete",
        "_deadline",
        "_max_bytes",
        "_receive",
        "_received",
        "_request_id",
        "_seconds",
        "_send",
        "started",
        "status",
    )

    def __init__(
        self, receive: Receive, send: Send, request_id: bytes, max_bytes: int, seconds: float
    ) -> None:
        self._receive, self._send, self._request_id = receive, send, request_id
        self._max_bytes, self._seconds = max_bytes, seconds
        self._deadline = asyncio.get_running_loop().time() + seconds
        self._received = 0
        self._complete = False
        self.started = False
        self.status = 500  # until an answer starts

    async def receive(self) -> Message:
        if self._complete:  # after the body, receive() waits for a disconnect: no deadline
            return await self._receive()
        try:
            # `timeout`, not `wait_for`: wait_for wraps every receive in a task of its own
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise _BodyTooSlow(self._seconds) from None
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._max_bytes:
                raise _TooLarge(self._max_bytes)
            self._complete = not message.get("more_body", False)
        else:
            self._complete = True
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started, self.status = True, message["status"]
            message = {**message, "headers": self._headers(message.get("headers", ()))}
        await self._send(message)

    def _headers(self, given: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in given if k.lower() != b"server"]
        present = {k.lower() for k, _ in headers}
        html = any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers)
        headers += [(k, v) for k, v in _ALWAYS if k not in present]
        if b"cache-control" not in present:
            headers.append((b"cache-control", b"no-store"))
        if b"content-security-policy" not in present:
            headers.append((b"content-security-policy", (PAGE_CSP if html else DATA_CSP).encode()))
        headers.append((b"x-request-id", self._request_id))
        return headers


async def _too_large(send: Send, scope: Scope, max_bytes: int) -> None:
    await send_problem(
        send,
        scope,
        413,
        "CONTENT_TOO_LARGE",
        f"request bodies are limited to {max_bytes} bytes",
        title=ContentTooLarge.title,
    )


_TITLES = {
    408: "The request took too long to arrive",
    500: "Internal error",
    503: "The database is unavailable; retry later",
}


async def send_problem(
    send: Send,
    scope: Scope,
    status: int,
    code: str,
    detail: str,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    close: bool = False,
    title: str | None = None,
) -> None:
    body = json.dumps(
        {
            "type": f"https://san.example/problems/{code.lower().replace('_', '-')}",
            "title": title or _TITLES[status],
            "status": status,
            "detail": detail,
            "code": code,
            "instance": scope.get("path", ""),
        }
    ).encode()
    response_headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
        *([(b"connection", b"close")] if close else []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": response_headers})
    await send({"type": "http.response.body", "body": body})
