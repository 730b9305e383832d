"""Connecting to RabbitMQ without leaving a half-made connection behind."""

from __future__ import annotations

import contextlib

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractRobustConnection
from aio_pika.connection import make_url


async def connect(
    url: str, *, robust: bool = False, connect_timeout: float | None = None
) -> AbstractConnection:
    """`aio_pika.connect` (or `connect_robust`), but a connection that failed to open — or
    whose opening was cancelled — is closed here. aio-pika drops it open, and its `__del__`
    then makes a `close()` coroutine that no loop may ever run: a "never awaited" warning
    wherever the garbage collector happens to run."""
    cls = aio_pika.RobustConnection if robust else aio_pika.Connection
    connection = cls(make_url(url))
    try:
        await connection.connect(timeout=connect_timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            await connection.close()
        raise
    return connection


async def connect_robust(
    url: str, *, connect_timeout: float | None = None
) -> AbstractRobustConnection:
    """`connect(url, robust=True)`, typed as the robust connection it is."""
    connection = await connect(url, robust=True, connect_timeout=connect_timeout)
    assert isinstance(connection, AbstractRobustConnection)
    return connection
