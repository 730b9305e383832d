"""Start-up checks: a service that cannot reach a server it needs exits at once with one line
naming the server and its address (`san_common.cli.Unreachable`). Once running, a service
rides out outages instead; its `/readyz` says what is missing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from san_common.broker.connect import connect
from san_common.cli import STARTUP_ERRORS, Unreachable

CHECK_TIMEOUT_SECONDS = 10.0
# A refused login or a missing database (DBAPIError) stops the service just the same.
_DATABASE_ERRORS: tuple[type[BaseException], ...] = (*STARTUP_ERRORS, sa_exc.DBAPIError)


async def require_database(prog: str, engine: AsyncEngine, url: str) -> None:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS), engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except _DATABASE_ERRORS as exc:
        raise Unreachable(prog, "PostgreSQL", url, exc) from None


async def require_broker(prog: str, url: str) -> None:
    try:
        with quiet_logger("aiormq.connection"):  # it logs the refusal too; ours names the URL
            connection = await connect(url, connect_timeout=CHECK_TIMEOUT_SECONDS)
    except STARTUP_ERRORS as exc:
        raise Unreachable(prog, "RabbitMQ", url, exc) from None
    await connection.close()


@contextlib.contextmanager
def quiet_logger(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled
