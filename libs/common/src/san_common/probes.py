"""A minimal HTTP endpoint for processes without a web framework (relay, workers, recovery):
`/healthz` (alive), `/readyz` (dependencies reachable) and `/metrics` (Prometheus)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[bool]]


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
                ok = await asyncio.wait_for(self._ready(), timeout=5)
            except Exception:  # a readiness probe reports, it never raises
                ok = False
            if ok:
                return "200 OK", "application/json", b'{"status":"ready"}'
            return "503 Service Unavailable", "application/json", b'{"status":"not ready"}'
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest()
        return "404 Not Found", "application/json", b'{"status":"not found"}'
