"""A real HTTP server on loopback, served from a background thread: the base of the fakes
of servers we do not own (AI, GitHub, an OTLP collector), so the real clients run."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

F = TypeVar("F")


class LoopbackHTTPServer(ThreadingHTTPServer, Generic[F]):
    fake: F  # what the request handlers serve from
    daemon_threads = True
    block_on_close = False  # a request held on purpose (a timeout fault) must not delay shutdown
    # socketserver's listen backlog is 5: a worker redelivering 100 jobs at once (after a
    # database outage) overflowed it on a loaded machine, and the dropped connections were
    # reset mid-request — AI "ReadError"s a real server's backlog would not produce, which
    # spent the jobs' tries. A real server's backlog, as uvicorn's and nginx's default.
    request_queue_size = 2048

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up, or a connection reset on purpose: expected in tests


class LoopbackServer:
    """Context manager: listening on 127.0.0.1 (a free port) inside `with`, shut down after.
    `_stopping` is set first on exit, to wake requests a fake holds on purpose."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._stopping = threading.Event()
        self._server: LoopbackHTTPServer[LoopbackServer] = LoopbackHTTPServer(
            ("127.0.0.1", 0), handler
        )
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def origin(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"
