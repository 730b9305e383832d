"""The broker's state for a process that does not otherwise talk to it (the API): one
long-lived connection, opened in the background and kept by aio_pika's reconnects, whose
state `/readyz` reports. A probe reads the state; it never opens a connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aio_pika.abc import AbstractRobustConnection

from san_common.broker.connect import connect_robust
from san_common.cli import STARTUP_ERRORS, describe
from san_common.dependencies import quiet_logger

log = logging.getLogger(__name__)

MAX_RETRY_SECONDS = 30.0


def connection_is_open(connection: AbstractRobustConnection | None) -> bool:
    """Open and not between aio_pika's reconnect attempts."""
    return connection is not None and not connection.is_closed and connection.connected.is_set()


class BrokerMonitor:
    def __init__(self, url: str, *, retry_seconds: float = 1.0) -> None:
        self._url = url
        self._retry_seconds = retry_seconds
        self._connection: AbstractRobustConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        self._first_attempt = asyncio.Event()
        self._connected = asyncio.Event()

    @property
    def connection(self) -> AbstractRobustConnection | None:
        return self._connection

    async def wait_connected(self) -> AbstractRobustConnection:
        """The connection, once the first attempt that succeeds has made it."""
        await self._connected.wait()
        assert self._connection is not None
        return self._connection

    async def start(self, wait_seconds: float = 3.0) -> None:
        """Connect in the background; wait a little for the first attempt, so a probe right
        after start-up reports the broker's real state rather than "down" for a moment."""
        self._task = asyncio.create_task(self._connect())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first_attempt.wait(), wait_seconds)

    def is_up(self) -> bool:
        return connection_is_open(self._connection)

    async def _connect(self) -> None:
        """The first connection, retried with backoff; aio_pika reconnects after that."""
        delay = self._retry_seconds
        while True:
            try:
                with quiet_logger("aiormq.connection"):  # our warning below says it once
                    self._connection = await connect_robust(self._url, connect_timeout=5)
                self.last_error = None
                self._connected.set()
                return
            except STARTUP_ERRORS as exc:
                if self.last_error is None:  # one line per outage, not one per attempt
                    log.warning(
                        "broker unreachable; retrying in the background",
                        extra={"fields": {"error": describe(exc)}},
                    )
                self.last_error = describe(exc)
            finally:
                self._first_attempt.set()
            await asyncio.sleep(delay)
            delay = min(MAX_RETRY_SECONDS, delay * 2)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._connection is not None:
            await self._connection.close()
