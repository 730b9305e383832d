"""A TCP proxy on loopback in front of a real server, for outages that concern one test
only (the machine's RabbitMQ is shared: stopping it would break every other run).

`cut()` refuses new connections and aborts the open ones, as a stopped broker would;
`restore()` listens again on the same port. `freeze()` is a network partition that sends
no reset: connections stay open and bytes go nowhere, in either direction, until `thaw()`
lets them through again (as TCP retransmits them once a partition heals). `strand()`
freezes the connections open now for good and lets new ones through, as a failover to a
new address or a NAT that forgot its mappings leaves a client's old sockets. `accepted`
counts the connections clients opened through it, which is how a test sees whether a probe
connects per call.

The upstream is a URL with a host and port, or a PostgreSQL URL whose `host` parameter is
a socket directory (the embedded server's): clients then reach it over TCP, `url` says how.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from tests import infra


class TcpProxy:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        query = parse_qs(parts.query)
        socket_dir = query.pop("host", [None])[0]
        if socket_dir is not None and socket_dir.startswith("/"):  # libpq: a socket directory
            port = int(query.pop("port", [parts.port or 5432])[0])
            self._socket: str | None = f"{socket_dir}/.s.PGSQL.{port}"
        else:
            self._socket = None
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self._url = parts._replace(query=urlencode(query, doseq=True))
        self.port = infra.free_port()
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._gates: set[asyncio.Event] = set()  # one per connection, for strand()
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def url(self) -> str:
        """The upstream URL with this proxy as its host and port."""
        credentials = self._url.netloc.rpartition("@")[0]
        netloc = f"{credentials}@127.0.0.1:{self.port}" if credentials else f"127.0.0.1:{self.port}"
        return urlunsplit(self._url._replace(netloc=netloc))

    def freeze(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def thaw(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    def strand(self) -> None:
        def close_gates() -> None:
            for gate in self._gates:
                gate.clear()

        self._loop.call_soon_threadsafe(close_gates)

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        self.restore()
        return self

    def __exit__(self, *_: object) -> None:
        self.cut()
        self._call(self._finish_pipes())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def cut(self) -> None:
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._handle, "127.0.0.1", self.port, reuse_address=True
            )

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _finish_pipes(self) -> None:
        """Cancel what is left of aborted connections, in the proxy's own loop."""
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            if self._socket is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(self._socket)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_writer}
        gate = asyncio.Event()
        gate.set()
        self._gates.add(gate)
        await asyncio.gather(
            _pipe(reader, up_writer, self._flowing, gate),
            _pipe(up_reader, writer, self._flowing, gate),
            return_exceptions=True,
        )
        self._gates.discard(gate)
        for end in (writer, up_writer):
            self._open.discard(end)
            end.transport.abort()


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    flowing: asyncio.Event,
    gate: asyncio.Event,
) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            # frozen or stranded: held, neither delivered nor refused
            await flowing.wait()
            await gate.wait()
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
