"""The HTTP edge: what the server accepts and what every answer carries (docs/security.md).

- `server_options(settings)`: uvicorn with the httptools parser and a limit on a request's
  head (`HTTP_MAX_HEADER_BYTES`; httptools itself has none), a time limit on receiving a
  request's headers (`HTTP_HEADER_TIMEOUT_SECONDS`, which also closes a
  connection that never sends a request; both in `san_common.compat`: they subclass
  uvicorn's protocol), a cap on open connections (`HTTP_MAX_CONNECTIONS`) that spares the
  health and readiness probes, and no `server` banner.
- `CapacityMiddleware`: a request beyond the connection cap is answered 503 problem+json
  with `Retry-After`, and its connection closed.
- `BodyTimeoutMiddleware`: a request body must arrive within `HTTP_BODY_TIMEOUT_SECONDS` of
  the request's start (408, connection closed), whatever pace it drips at.
- `SecurityHeadersMiddleware`: nosniff, no referrer, no framing, `Cache-Control: no-store`
  unless a route chose its own, and a CSP (pages: own scripts only; anything else: none).
- `UnhandledErrorMiddleware`: an unexpected exception becomes a 500 problem (a lost
  database a 503 with `Retry-After`) *answered here*, so the connection stays usable;
  Starlette's own last-resort handler re-raises, which makes uvicorn drop the connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from san_api.errors import PROBLEM_JSON, database_unavailable
from san_api.health import PROBE_PATHS
from san_api.settings import ApiSettings
from san_common.compat import OVER_CAPACITY, head_limited_httptools
from san_common.outages import DATABASE

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


class _BodyTooSlow(HTTPException):
    """An HTTPException so that FastAPI's body reader re-raises it as is."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {seconds:g} seconds",
            headers={"Connection": "close"},
        )


class BodyTimeoutMiddleware:
    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop_deadline = asyncio.get_running_loop().time() + self.seconds
        complete = False
        started = False

        async def timed_receive() -> Message:
            nonlocal complete
            if complete:  # after the body, receive() waits for a disconnect: no deadline
                return await receive()
            try:
                # `timeout`, not `wait_for`: wait_for wraps every receive in a task of its own
                async with asyncio.timeout_at(loop_deadline):
                    message = await receive()
            except TimeoutError:
                raise _BodyTooSlow(self.seconds) from None
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed_receive, tracking_send)
        except _BodyTooSlow as exc:
            if not started:
                await send_problem(send, scope, 408, "REQUEST_TIMEOUT", str(exc.detail), close=True)


BUSY_RETRY_AFTER_SECONDS = 2


class CapacityMiddleware:
    """Answers the requests the edge protocol marked as beyond the connection cap."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get(OVER_CAPACITY):
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
        await self.app(scope, receive, send)


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"server"]
                present = {k.lower() for k, _ in headers}
                html = any(
                    k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers
                )
                extra = [(k, v) for k, v in _ALWAYS if k not in present]
                if b"cache-control" not in present:
                    extra.append((b"cache-control", b"no-store"))
                if b"content-security-policy" not in present:
                    extra.append(
                        (b"content-security-policy", (PAGE_CSP if html else DATA_CSP).encode())
                    )
                message = {**message, "headers": headers + extra}
            await send(message)

        await self.app(scope, receive, with_headers)


class UnhandledErrorMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
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
