"""A worker's ear for cancels of running jobs: one LISTEN connection per process on
`lifecycle.CANCEL_CHANNEL`, outside the pool (a pooled connection is shared and reset;
this one must stay subscribed). `lifecycle.cancel` notifies in the transaction that ends
the job; the executor stops the handler if this process runs it.

A lost connection is replaced after a pause; a cancel announced while none was listening
is not heard, and the handler then runs to its end — its writes are fenced out (the job is
no longer PROCESSING), so a missed NOTIFY costs the call, never a wrong result. A silent
connection (a partition) is probed and dropped like a lost one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

import asyncpg

from san_common.jobs.lifecycle import CANCEL_CHANNEL
from san_common.outages import DATABASE

# How the connection shows in `pg_stat_activity`.
APPLICATION_NAME = "san-cancel-listener"
_RECONNECT_SECONDS = 1.0
_PROBE_SECONDS = 15.0


class CancelListener:
    def __init__(
        self, url: str, on_cancel: Callable[[uuid.UUID], object], *, timeout_seconds: float
    ) -> None:
        self._url = url  # libpq-style (`db.engine.plain_url`)
        self._on_cancel = on_cancel
        self._timeout = timeout_seconds
        self.listening = asyncio.Event()  # set while subscribed (the tests wait on it)

    async def run(self, stop: asyncio.Event) -> None:
        """Listen until `stop` is set, reconnecting after any loss."""
        while not stop.is_set():
            began = time.monotonic()
            try:
                await self._listen(stop, began)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # one WARNING per outage for the whole process, not one per loop
                DATABASE.lost(exc, "listening for cancels")
            self.listening.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _RECONNECT_SECONDS)

    async def _listen(self, stop: asyncio.Event, began: float) -> None:
        connection = await asyncpg.connect(
            self._url,
            timeout=self._timeout,
            command_timeout=self._timeout,
            server_settings={"application_name": APPLICATION_NAME},
        )
        lost = asyncio.Event()
        try:
            connection.add_termination_listener(lambda _conn: lost.set())
            await connection.add_listener(CANCEL_CHANNEL, self._heard)
            self.listening.set()
            DATABASE.answered(began)
            while not stop.is_set() and not lost.is_set():
                waits = [asyncio.ensure_future(e.wait()) for e in (stop, lost)]
                _, pending = await asyncio.wait(
                    waits, timeout=_PROBE_SECONDS, return_when=asyncio.FIRST_COMPLETED
                )
                for waiting in pending:
                    waiting.cancel()
                if not stop.is_set() and not lost.is_set():
                    await connection.fetchval("SELECT 1", timeout=self._timeout)
            if lost.is_set() and not stop.is_set():
                raise ConnectionError("the LISTEN connection was closed")
        finally:
            if not connection.is_closed():
                connection.terminate()

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            return
        self._on_cancel(job_id)
