"""The one home of SAN's reliance on library internals (docs/hot-paths.md, "Library
internals kept").

Each function below uses something its library does not promise to keep: a name outside
its documented API, or a subclass of a class the library treats as its own. Each is kept
because the public route costs more than it is worth (the figures are in the doc), and
each is held in place two ways: the library's version range is pinned in the
`pyproject.toml` that depends on it, and `tests/unit/test_compat.py` checks what is relied
on, so an upgrade that breaks it fails there, not in a running service.

Nothing else in `libs/` or `services/` may import a library's private names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.orm import configure_mappers
from sqlalchemy.orm.instrumentation import manager_of_class

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

T = TypeVar("T")

_FACTORIES: dict[type[Any], Callable[[], Any]] = {}


# --- SQLAlchemy (libs/common/pyproject.toml) -------------------------------------------


def new_orm_instance(cls: type[T], values: Mapping[str, Any]) -> T:
    """A transient instance of the mapped class `cls` holding `values`, built the way the
    ORM builds the rows it loads: without `__init__`, its values set in its `__dict__`.

    The constructor fires an attribute event per value, ~4–5 % of a drained job's worker
    CPU for the claimed `AsyncJob` (docs/hot-paths.md). The instance is for reading only:
    its values are not "changes", so it must never be added to a session."""
    factory = _FACTORIES.get(cls)
    if factory is None:
        # The constructor's first call configures the mappers; `new_instance` does not,
        # and an attribute of an unconfigured mapper cannot be read (a fresh worker
        # process may claim before anything else touched the ORM).
        configure_mappers()
        factory = _FACTORIES[cls] = manager_of_class(cls).new_instance
    instance: T = factory()
    instance.__dict__.update(values)
    return instance


# --- uvicorn and httptools (services/api/pyproject.toml) -------------------------------


# The ASGI scope key the protocol sets on a request that arrived beyond the connection cap;
# the app answers it (san_api.edge.EdgeMiddleware) instead of serving it.
OVER_CAPACITY = "san.over_capacity"


def head_limited_httptools(
    header_timeout: float,
    max_header_bytes: int,
    *,
    max_connections: int | None = None,
    exempt_paths: frozenset[str] = frozenset(),
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the limits it lacks (docs/security.md):

    - a request's head (request line and headers) is at most `max_header_bytes`, else 400
      and the connection closed — httptools buffers a header however large. Counted
      exactly: h11's `max_incomplete_event_size` bounds only a head still incomplete, so
      one that arrived whole in a single read (up to 256 KiB) passed;
    - a deadline for the head: from the connection's start, or from the first byte of a
      keep-alive connection's next request, until the head is complete (uvicorn itself
      only times idle keep-alive connections, so a request whose headers never end stayed
      open forever);
    - a cap on open connections that spares the probes: with `max_connections`, a request
      that arrives while that many connections (or requests) are open is marked
      `OVER_CAPACITY` in its scope, for the app to refuse in its own words, unless its path
      is one of `exempt_paths` (the health and readiness probes, which a flood of user
      connections must not fail). uvicorn's own `limit_concurrency` (run uvicorn without
      it) answers every path alike, in plain text.

    None can be built on uvicorn's public surface (the ASGI app sees a request only once
    its head is complete), hence a subclass of its protocol, relying on its parser
    callbacks, `cycle`, `transport`, `loop`, `logger`, `send_400_response`, `url`, `scope`
    and the server's `connections` and `tasks`. Imported
    here, not at module level: only the API depends on uvicorn."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class EdgeProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None
            self._in_head = True  # after a whole request, or inside one's head
            self._head_bytes = 0  # received since the head began (incomplete parts too)
            self._head_size = 0  # the head's complete parts (request line, headers)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._head_bytes += len(data)
                self._arm_header_timer()
            super().data_received(data)
            # Still inside the head after this chunk (a chunk completing it may carry body
            # bytes too: those are not the head's): over the limit is refused.
            if (
                self._in_head
                and self._head_bytes > max_header_bytes
                and not self.transport.is_closing()
            ):
                self.logger.warning("Request headers too large.")
                if self.cycle is not None and not self.cycle.response_complete:
                    self.transport.close()  # a pipelined head: no 400 inside an answer
                else:
                    self.send_400_response("Request headers too large.")

        def on_message_begin(self) -> None:
            self._head_size = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
            super().on_header(name, value)

        def _count_head(self, size: int) -> None:
            # The head's complete parts, exactly (data_received's count cannot tell a head
            # from the body bytes that arrive with it). Raising from a parser callback makes
            # uvicorn answer 400 and close.
            self._head_size += size
            if self._head_size > max_header_bytes:
                raise ValueError("request head too large")

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._disarm_header_timer()
            if max_connections is not None and self._over_capacity(max_connections):
                # the scope this request's cycle is built from, in the call below
                self.scope[OVER_CAPACITY] = True  # type: ignore[literal-required]
            super().on_headers_complete()

        def _over_capacity(self, cap: int) -> bool:
            if len(self.connections) < cap and len(self.tasks) < cap:
                return False
            path = self.url.split(b"?", 1)[0].decode("latin-1")
            return path not in exempt_paths

        def on_message_complete(self) -> None:
            super().on_message_complete()
            # Whatever arrives after a whole request is the next one's head, even while
            # this one is still being answered (pipelining).
            self._in_head, self._head_bytes = True, 0

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_late)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self._in_head and not self.transport.is_closing():
                self.transport.close()

    return EdgeProtocol
