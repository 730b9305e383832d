"""One LISTEN connection per API process for `san_job_events`, fanned out in memory.

Subscribers are woken, never handed the payload: each re-reads the job's event log from
its last event id, so a notification lost while the connection was down (the hub wakes
everyone when it comes back) or two changes in one wake-up lose nothing.

A LISTEN connection that goes silent (a partition, a failover that strands it) reports
nothing: no notification arrives, and no error either. While anyone listens, the hub asks
it a trivial question every `probe_seconds`; one it does not answer within the timeout is
dropped and replaced, as a lost one is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg

from san_common.db.engine import plain_url
from san_common.outages import DATABASE

log = logging.getLogger(__name__)

CHANNEL = "san_job_events"
ALL_JOBS: None = None  # subscribe to every job's changes (the operator console)
_RECONNECT_SECONDS = 1.0


@dataclass(eq=False)
class Subscription:
    job_id: uuid.UUID | None
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class JobEventHub:
    def __init__(
        self, database_url: str, *, timeout_seconds: float, probe_seconds: float = 15.0
    ) -> None:
        self._url = plain_url(database_url)
        self._timeout = timeout_seconds  # to connect and to LISTEN: a silent server is a 503
        self._probe_seconds = probe_seconds
        self._subscribers: dict[uuid.UUID | None, set[Subscription]] = {}
        self._connection: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        self._prober: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: uuid.UUID | None) -> AsyncIterator[Subscription]:
        """Register first, then the caller reads the log: nothing falls in between."""
        subscription = Subscription(job_id)
        self._subscribers.setdefault(job_id, set()).add(subscription)
        try:
            await self._ensure_listening()
            yield subscription
        finally:
            group = self._subscribers.get(job_id)
            if group is not None:
                group.discard(subscription)
                if not group:
                    del self._subscribers[job_id]

    async def _ensure_listening(self) -> None:
        async with self._lock:
            if self._connection is None or self._connection.is_closed():
                connection = await asyncpg.connect(
                    self._url, timeout=self._timeout, command_timeout=self._timeout
                )
                await connection.add_listener(CHANNEL, self._on_notify)
                connection.add_termination_listener(self._on_lost)
                self._connection = connection
                self._wake_all()  # anything missed while not listening is in the log
            if self._prober is None or self._prober.done():
                self._prober = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self) -> None:
        """While anyone listens: drop the listening connection when it stops answering
        (its termination listener then listens again on a new one)."""
        while self._subscribers:
            await asyncio.sleep(self._probe_seconds)
            connection = self._connection
            if connection is None or connection.is_closed():
                continue  # lost already: being replaced
            try:
                await connection.fetchval("SELECT 1", timeout=self._timeout)
            except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                if not connection.is_closed():
                    log.warning("job-events LISTEN connection silent; dropping it")
                    connection.terminate()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        try:
            job_id = uuid.UUID(payload.split(":", 1)[0])
        except ValueError:
            return
        for key in (job_id, ALL_JOBS):
            for subscription in self._subscribers.get(key, ()):
                subscription.wake.set()

    def _on_lost(self, _conn: object) -> None:
        # INFO: listening again is routine; an outage behind it is the reconnect's one
        # WARNING (san_common.outages), not a second line here
        log.info("job-events LISTEN connection lost; listening again")
        self._wake_all()
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        while self._subscribers:
            began = time.monotonic()
            try:
                await self._ensure_listening()
            except (OSError, asyncpg.PostgresError) as exc:
                DATABASE.lost(exc, "job-events listener")
                await asyncio.sleep(_RECONNECT_SECONDS)
            else:
                DATABASE.answered(began)
                return

    def _wake_all(self) -> None:
        for group in self._subscribers.values():
            for subscription in group:
                subscription.wake.set()

    async def aclose(self) -> None:
        for task in (self._keeper, self._prober):
            if task is not None:
                task.cancel()
        if self._connection is not None and not self._connection.is_closed():
            await self._connection.close()
