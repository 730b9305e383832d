"""Engine and session factory. Built by a service's wiring point, never at import time."""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from sqlalchemy import event
from sqlalchemy.engine import Engine, ExceptionContext, make_url
from sqlalchemy.exc import InvalidatePoolError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from san_common.errors import is_connection_loss

if TYPE_CHECKING:
    import asyncpg


def async_url(url: str) -> str:
    """Turn a deployer's `postgresql://…` URL into the asyncpg dialect URL SQLAlchemy wants."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def plain_url(url: str) -> str:
    """The libpq-style URL (for asyncpg.connect, LISTEN connections, psql)."""
    parsed = make_url(url).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


def create_engine(
    url: str,
    *,
    pool_size: int = 10,
    echo: bool = False,
    pre_ping: bool = True,
    generic_plans: bool = False,
    timeout_seconds: float | None = None,
    idle_transaction_seconds: float | None = None,
) -> AsyncEngine:
    """The hot paths (the workers' claims and completions, the relay's rounds, the API's
    requests) turn the first two defaults off (docs/hot-paths.md):

    - `pre_ping=False`: with asyncpg a pre-ping is three round trips per checkout (BEGIN,
      `;`, ROLLBACK), more than a claim itself. Nothing is lost without it: a connection
      that died fails its first statement, which the runtime treats as an outage (the job
      is released and requeued), the relay as a failed round and the API as a 503 — and
      SQLAlchemy then invalidates the whole pool at once;
    - `generic_plans=True` (the workers): PostgreSQL re-plans the claim's WITH statement for
      every batch otherwise (its array parameter makes a custom plan look cheaper), and
      planning cost more than running it. The workers' other statements are key lookups,
      which a generic plan serves as well.

    `timeout_seconds` bounds each wait on the server — a pooled connection, a connect, a
    statement — so a server that stops answering without closing the connection (a network
    partition) fails the caller in time instead of holding it until TCP gives up.

    `idle_transaction_seconds` is the server's side of the same partition: a transaction
    left open by a client that no longer answers is ended by PostgreSQL after that long
    (`idle_in_transaction_session_timeout`), so its row locks do not stall the processes
    that took over its work. Only for engines whose transactions never wait on anything
    but their own statements.
    """
    if not url:
        raise ValueError("DATABASE_URL is empty: start the local launcher or set DATABASE_URL")
    connect_args: dict[str, object] = {}
    server_settings: dict[str, str] = {}
    if generic_plans:
        server_settings["plan_cache_mode"] = "force_generic_plan"
    if idle_transaction_seconds is not None:
        server_settings["idle_in_transaction_session_timeout"] = (
            f"{round(idle_transaction_seconds * 1000)}ms"
        )
    if server_settings:
        connect_args["server_settings"] = server_settings
    if timeout_seconds is not None:
        connect_args.update(timeout=timeout_seconds, command_timeout=timeout_seconds)
    engine = create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=pre_ping,
        connect_args=connect_args,
        echo=echo,
        **({"pool_timeout": timeout_seconds} if timeout_seconds is not None else {}),
    )
    if timeout_seconds is not None:
        event.listen(engine.sync_engine, "handle_error", _silence_is_a_disconnect)
    return engine


def _silence_is_a_disconnect(context: ExceptionContext) -> None:
    """A statement the server did not answer in time. SQLAlchemy already discards its
    connection, but keeps the rest of the pool (an asyncio timeout is "the caller gave
    up", not "the server went away"). Here it means the server went silent: the pooled
    connections opened before it very likely went with it (a partition, a failover), and
    each would cost a caller one more timeout, so they are replaced as after a reset."""
    if isinstance(context.original_exception, TimeoutError):
        context.is_disconnect = True
        context.invalidate_pool_on_disconnect = True


@asynccontextmanager
async def driver_connection(engine: AsyncEngine) -> AsyncIterator[asyncpg.Connection]:
    """A pooled connection's asyncpg driver, in autocommit, for a hot path's one statement
    run without SQLAlchemy's execution path (half of a lone claim's time went to that path:
    docs/hot-paths.md).

    SQLAlchemy never sees what such a statement raises, so what it would do is done here:
    a connection lost under the statement is not pooled again, and a statement the server
    did not answer in time replaces the whole pool, as `_silence_is_a_disconnect` has it
    do for its own statements (the pooled connections went silent with that one)."""
    async with engine.connect() as connection:
        pooled = await connection.get_raw_connection()
        try:
            yield pooled.driver_connection
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                _SilentServer.of(engine.sync_engine).heard()
            if is_connection_loss(exc):
                await connection.invalidate(exc)
            raise


class _SilentServer:
    """A statement on the driver met a silent server: the pool's next checkout replaces
    every connection opened before it, SQLAlchemy's own handling of a disconnect that
    invalidates the pool, reached the public way (a checkout listener raising
    `InvalidatePoolError`)."""

    _of: weakref.WeakKeyDictionary[Engine, _SilentServer] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self._heard = False

    @classmethod
    def of(cls, engine: Engine) -> _SilentServer:
        silent = cls._of.get(engine)
        if silent is None:
            silent = cls._of[engine] = cls()
            event.listen(engine, "checkout", silent._checkout)
        return silent

    def heard(self) -> None:
        self._heard = True

    def _checkout(self, *_: object) -> None:
        if self._heard:
            self._heard = False
            raise InvalidatePoolError("the server went silent")


def create_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False)


def bound_engine(session_factory: async_sessionmaker[AsyncSession]) -> AsyncEngine:
    """The engine a session factory is bound to, for the hot paths that use no ORM and
    run their statements on a plain connection."""
    engine = _BOUND.get(session_factory)
    if engine is None:
        # a session holds nothing until it runs a statement: this one only answers
        bind = session_factory().bind
        assert isinstance(bind, AsyncEngine), "the session factory must be bound to an engine"
        engine = _BOUND[session_factory] = bind
    return engine


# Asked for each registration on the driver: answered once per factory.
_BOUND: weakref.WeakKeyDictionary[async_sessionmaker[AsyncSession], AsyncEngine] = (
    weakref.WeakKeyDictionary()
)
