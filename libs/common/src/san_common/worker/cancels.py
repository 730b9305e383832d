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
import logging
import uuid
from collections.abc import Callable

import asyncpg

from san_common.errors import cause_chain
from san_common.jobs.lifecycle import CANCEL_CHANNEL

log = logging.getLogger("san_common.worker")

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
            try:
                await self._listen(stop)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.warning(
                    "cancel LISTEN connection lost; listening again",
                    extra={"fields": {"error": cause_chain(exc)[:300]}},
                )
            self.listening.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _RECONNECT_SECONDS)

    async def _listen(self, stop: asyncio.Event) -> None:
        connection = await asyncpg.connect(
            self._url, timeout=self._timeout, command_timeout=self._timeout
        )
        lost = asyncio.Event()
        try:
            connection.add_termination_listener(lambda _conn: lost.set())
            await connection.add_listener(CANCEL_CHANNEL, self._heard)
            self.listening.set()
            while not stop.is_set() and not lost.is_set():
                waits = [asyncio.ensure_future(e.wait()) for e in (stop, lost)]
                _, pending = await asyncio.wait(
                    waits, timeout=_PROBE_SECONDS, return_when="FIRST_COMPLETED"
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
