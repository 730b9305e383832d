"""Readiness, and a minimal HTTP endpoint for processes without a web framework (relay,
workers, recovery): `/healthz` (alive), `/readyz` (able to do its own job) and `/metrics`.

Ready means able to do the process's own job (docs/reference/job-rules.md §7): the API needs
PostgreSQL only (the outbox absorbs a broker outage), a worker its own open consumer, the relay
both, recovery PostgreSQL. A `Readiness` has *required* checks, which decide, and *reported* ones,
which are shown in the body and as `san_dependency_up` but never fail the probe.

No check opens a connection per call: the database check borrows a connection from the
process's pool, broker checks read the state of a connection the process keeps open anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

UP, DOWN = "up", "down"
CHECK_TIMEOUT_SECONDS = 3.0

DEPENDENCY_UP = Gauge(
    "san_dependency_up",
    "1 when the dependency answered this process's last readiness check",
    ["dependency"],
)

# One dependency's state: UP, or DOWN with a short reason.
State = tuple[str, str | None]
Check = Callable[[], Awaitable[State]]


@dataclass(frozen=True)
class Report:
    ready: bool
    checks: Mapping[str, str]
    reasons: Mapping[str, str]

    def body(self) -> bytes:
        document: dict[str, object] = {
            "status": "ready" if self.ready else "not ready",
            "checks": dict(self.checks),
        }
        if self.reasons:
            document["reasons"] = dict(self.reasons)
        return json.dumps(document).encode()


class Readiness:
    def __init__(self, required: Mapping[str, Check], reported: Mapping[str, Check] | None = None):
        self._required = dict(required)
        self._reported = dict(reported or {})

    async def __call__(self) -> Report:
        checks = {**self._required, **self._reported}
        states = await asyncio.gather(*(_bounded(check) for check in checks.values()))
        by_name = dict(zip(checks, states, strict=True))
        for name, (state, _) in by_name.items():
            DEPENDENCY_UP.labels(name).set(1 if state == UP else 0)
        return Report(
            ready=all(by_name[name][0] == UP for name in self._required),
            checks={name: state for name, (state, _) in by_name.items()},
            reasons={name: reason for name, (_, reason) in by_name.items() if reason},
        )


async def _bounded(check: Check) -> State:
    try:
        return await asyncio.wait_for(check(), CHECK_TIMEOUT_SECONDS)
    except TimeoutError:
        return DOWN, "timed out"
    except Exception as exc:  # a readiness probe reports, it never raises
        return DOWN, type(exc).__name__


def database(engine: AsyncEngine) -> Check:
    """PostgreSQL answers `SELECT 1` on a pooled connection."""

    async def check() -> State:
        async with engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
        return UP, None

    return check


def flag(is_up: Callable[[], bool], reason: str) -> Check:
    """A state the process already knows (a connection it keeps open, a consumer)."""

    async def check() -> State:
        return (UP, None) if is_up() else (DOWN, reason)

    return check


ReadinessCheck = Callable[[], Awaitable[Report]]


class ProbeServer:
    def __init__(self, host: str, port: int, ready: ReadinessCheck) -> None:
        self._host, self._port, self._ready = host, port, ready
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log.info("probes listening", extra={"fields": {"port": self.port}})

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (
                b"\r\n",
                b"\n",
                b"",
            ):
                pass
            parts = request_line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            status, ctype, body = await self._route(path)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _route(self, path: str) -> tuple[str, str, bytes]:
        path = path.split("?", 1)[0]
        if path == "/healthz":
            return "200 OK", "application/json", b'{"status":"ok"}'
        if path == "/readyz":
            try:
                report = await self._ready()
            except Exception:  # a readiness probe reports, it never raises
                log.warning("readiness check failed", exc_info=True)
                report = Report(False, {}, {"readiness": "check failed"})
            status = "200 OK" if report.ready else "503 Service Unavailable"
            return status, "application/json", report.body()
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest()
        return "404 Not Found", "application/json", b'{"status":"not found"}'
