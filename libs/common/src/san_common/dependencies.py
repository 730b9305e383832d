"""Start-up checks: a service that cannot use a server it needs exits at once with one line
naming what is wrong, the setting that decides it and the fix (`san_common.cli`). Once
running, a service rides out outages instead; its `/readyz` says what is missing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from aiormq.exceptions import (
    AuthenticationError,
    ConnectionNotAllowed,
    ProbableAuthenticationError,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from san_common.cli import STARTUP_ERRORS, StartupFailure, Unreachable, redact_url

CHECK_TIMEOUT_SECONDS = 10.0
# A refused login or a missing database (DBAPIError) stops the service just the same.
DATABASE_ERRORS: tuple[type[BaseException], ...] = (*STARTUP_ERRORS, sa_exc.DBAPIError)
_LOGIN_REFUSED = frozenset({"28P01", "28000"})  # invalid password, no such role
_NO_DATABASE = "3D000"
_BROKER_LOGIN_REFUSED = (AuthenticationError, ProbableAuthenticationError)
_SCHEMA_STATE = text(
    "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'vector'),"
    " EXISTS (SELECT FROM pg_available_extensions WHERE name = 'vector'),"
    " to_regclass('alembic_version') IS NOT NULL"
)


def database_failure(prog: str, url: str, exc: BaseException) -> StartupFailure:
    """What a failed first connection to PostgreSQL means, as the one line to stop with."""
    where = f"PostgreSQL at {redact_url(url)}"
    state, reason = _sqlstate(exc)
    if state in _LOGIN_REFUSED:
        return StartupFailure(
            prog, f"{where} refused the login ({reason}): fix the user or password in DATABASE_URL"
        )
    if state == _NO_DATABASE:
        return StartupFailure(
            prog, f"{where}: {reason}: create it, or fix the database name in DATABASE_URL"
        )
    return Unreachable(
        prog,
        "PostgreSQL",
        url,
        exc,
        setting="DATABASE_URL",
        fix="start PostgreSQL, or fix the host and port in",
    )


def missing_pgvector(prog: str, url: str, *, installable: bool) -> StartupFailure:
    where = f"the database at {redact_url(url)}"
    if installable:
        return StartupFailure(
            prog, f"{where} has no pgvector extension: run `san-migrate`, which creates it"
        )
    return StartupFailure(
        prog,
        f"{where} is on a PostgreSQL server without pgvector: install pgvector there "
        "(https://github.com/pgvector/pgvector), or point DATABASE_URL at a server that has it",
    )


async def require_database(prog: str, engine: AsyncEngine, url: str) -> None:
    """PostgreSQL answers at `url`, accepts the login, and the database has pgvector and
    SAN's schema."""
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS), engine.connect() as connection:
            installed, available, migrated = (await connection.execute(_SCHEMA_STATE)).one()
    except DATABASE_ERRORS as exc:
        raise database_failure(prog, url, exc) from None
    if not installed:
        raise missing_pgvector(prog, url, installable=available)
    if not migrated:
        raise StartupFailure(
            prog, f"the database at {redact_url(url)} has no SAN schema: run `san-migrate` first"
        )


async def require_broker(prog: str, url: str) -> None:
    # Imported here: `san-migrate` and the API use this module and need no AMQP client.
    from san_common.broker.connect import connect

    try:
        with quiet_logger("aiormq.connection"):  # it logs the refusal too; ours names the URL
            connection = await connect(url, connect_timeout=CHECK_TIMEOUT_SECONDS)
    except _BROKER_LOGIN_REFUSED as exc:
        raise StartupFailure(
            prog,
            f"RabbitMQ at {redact_url(url)} refused the login ({type(exc).__name__}): "
            "fix the user or password in AMQP_URL",
        ) from None
    except ConnectionNotAllowed as exc:
        raise StartupFailure(
            prog,
            f"RabbitMQ at {redact_url(url)} refused the virtual host ({exc}): "
            "create it, or fix the path of AMQP_URL",
        ) from None
    except STARTUP_ERRORS as exc:
        raise Unreachable(
            prog,
            "RabbitMQ",
            url,
            exc,
            setting="AMQP_URL",
            fix="start RabbitMQ (`rabbitmq-server -detached`), or fix the host and port in",
        ) from None
    await connection.close()


def _sqlstate(exc: BaseException) -> tuple[str | None, str]:
    """The SQLSTATE and the server's own message, from anywhere in the exception's chain
    (SQLAlchemy wraps the driver's error, which carries them)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        state = getattr(current, "sqlstate", None)
        if isinstance(state, str):
            return state, " ".join(str(current).split())
        current = current.__cause__ or current.__context__ or getattr(current, "orig", None)
    return None, ""


@contextlib.contextmanager
def quiet_logger(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled
