"""Request dependencies. The session dependency owns the transaction: it commits when the
endpoint returns (before the response is sent) and rolls back when it raises, so a request
writes all or nothing. `transaction_on_connection` does the same on a connection of the
API's asyncpg pool, for the hot write path that runs no ORM session (`POST /scraps`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Annotated

import asyncpg
from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.ext.asyncio import AsyncSession

from san_api.auth.tokens import InvalidToken, TokenVerifier
from san_api.errors import (
    AppError,
    DatabaseConnectionLost,
    NoConnectionInTime,
    Unauthorized,
    database_unavailable,
)
from san_api.settings import ApiSettings
from san_api.users import repository as users
from san_api.users.cache import ProvisionedUsers
from san_common.outages import DATABASE


@asynccontextmanager
async def _committed_or_rolled_back(
    commit: Callable[[], Awaitable[None]],
    rollback: Callable[[], Awaitable[None]],
    used: Callable[[], bool] = lambda: True,
) -> AsyncIterator[None]:
    """Commit when the block ends, roll back when it raises. A commit of a transaction that
    talked to the database (`used`) may end a database outage (`san_common.outages`)."""
    began = time.monotonic()
    try:
        yield
    except AppError as exc:
        # an error may have to keep what it wrote (a burnt OAuth state); none else does
        await (commit() if exc.keep_writes else rollback())
        raise
    except BaseException:
        await rollback()
        raise
    talked = used()
    await commit()
    if talked:
        DATABASE.answered(began)


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with (
        request.app.state.sessions() as session,
        _committed_or_rolled_back(session.commit, session.rollback, session.in_transaction),
    ):
        yield session


@asynccontextmanager
async def transaction_on_connection(request: Request) -> AsyncIterator[asyncpg.Connection]:
    """The request's transaction on a connection of the API's asyncpg pool, for the hot
    write path (`POST /scraps`, through `limits.LimitedTransaction`): its statements are
    named SQL and need no ORM session, and under load SQLAlchemy's session, statement
    machinery and pool cost the endpoint a third of its throughput and half its p99
    (docs/hot-paths.md)."""
    async with pooled_connection(request) as connection:
        transaction = connection.transaction()
        await transaction.start()  # raises at once on a closed connection
        # a rollback cut short leaves the connection in its transaction: the pool's reset
        # on release rolls it back, or closes the connection if it cannot
        async with _committed_or_rolled_back(transaction.commit, transaction.rollback):
            yield connection


def pooled_connection(request: Request) -> AbstractAsyncContextManager[asyncpg.Connection]:
    """A connection of the API's asyncpg pool (the request's transaction on it, the rate limiter).

    A connection error, a statement the server did not answer in time, or any error on a
    connection that closed under it (as SQLAlchemy's asyncpg dialect judges a disconnect),
    means the connection was lost — and so, likely, were the others opened before it (a
    restart, a terminate, a partition): the pool replaces them all at their next checkout,
    so the loss costs one 503, not one per pooled connection."""
    return app_connection(request.app)


@asynccontextmanager
async def app_connection(app: FastAPI) -> AsyncIterator[asyncpg.Connection]:
    """`pooled_connection` for the API's own background work (the direct publisher's
    marks): the same pool, the same handling of a lost connection."""
    pool: asyncpg.Pool = app.state.connections
    settings: ApiSettings = app.state.settings
    timeout = settings.api_database_timeout_seconds
    # The wait for a connection and its release (the reset) are bounded alike. Not by
    # acquire's own timeout: that runs the wait in a task of its own, a task a request.
    try:
        async with asyncio.timeout(timeout):
            connection = await pool.acquire()
    except TimeoutError as exc:
        raise NoConnectionInTime() from exc
    try:
        yield connection
    except Exception as exc:
        reason = database_unavailable(exc)
        if reason is None and not connection.is_closed():
            raise
        await pool.expire_connections()
        if reason is None:
            raise DatabaseConnectionLost() from exc
        raise
    finally:
        await pool.release(connection, timeout=timeout)


async def get_settings(request: Request) -> ApiSettings:
    # async: FastAPI runs a plain `def` dependency in a worker thread, for every request
    settings: ApiSettings = request.app.state.settings
    return settings


# scope="function": commit when the endpoint returns, *before* the response is sent (the
# default, "request", commits after it), so a 202 is only ever sent for committed rows.
SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]
SettingsDep = Annotated[ApiSettings, Depends(get_settings)]


@dataclass(frozen=True)
class Principal:
    user_id: uuid.UUID
    external_id: str


class BearerSubject(HTTPBearer):
    """The verified token's subject; needs no database (the rate limiter runs on it).

    FastAPI's `HTTPBearer` (its OpenAPI security scheme) answering the subject rather than
    the credentials: one dependency where a function depending on `HTTPBearer` would be
    two for FastAPI to solve on every request."""

    def __init__(self) -> None:
        super().__init__(auto_error=False, scheme_name="HTTPBearer")

    async def __call__(self, request: Request) -> str:  # type: ignore[override]
        scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("Missing bearer token: send 'Authorization: Bearer <token>'")
        verifier: TokenVerifier = request.app.state.tokens
        try:
            return await verifier.verify(token)
        except InvalidToken as exc:
            raise Unauthorized(f"Invalid bearer token: {exc}") from exc


get_subject = BearerSubject()
SubjectDep = Annotated[str, Depends(get_subject)]


async def get_current_user(request: Request, session: SessionDep, subject: SubjectDep) -> Principal:
    return await _principal(request, subject, partial(users.provision, session, subject))


async def user_on_connection(
    request: Request, connection: asyncpg.Connection, subject: str
) -> Principal:
    """The user, provisioned in the request's transaction on `connection` (a user row
    created in another transaction would hold the scrap's foreign key waiting on this one)."""
    return await _principal(request, subject, partial(users.provision_on, connection, subject))


async def _principal(
    request: Request, subject: str, provision: Callable[[], Awaitable[tuple[uuid.UUID, bool]]]
) -> Principal:
    known: ProvisionedUsers = request.app.state.provisioned_users
    user_id = known.get(subject)
    if user_id is None:  # the transaction connects only here, on a subject not seen before
        user_id, created = await provision()
        if not created:  # committed already; one created now is remembered next time
            known.remember(subject, user_id)
    return Principal(user_id, subject)


CurrentUser = Annotated[Principal, Depends(get_current_user)]
