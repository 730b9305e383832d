"""A worker process's presence (table `worker_presence`), for the operators' list of
workers: one upsert per beat, whatever the process runs — never a statement per job —
and the row removed when the process stops cleanly.

The beat is its own loop, not the lease keeper's: that one runs only while jobs are held,
and an idle worker must be listed too. What a worker is running is not reported here; the
console reads it from `async_jobs` (the PROCESSING jobs it holds), which is always true.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.errors import cause_chain
from san_common.models import WorkerPresence

log = logging.getLogger("san_common.worker")

# A worker silent for this long is gone for good: its row is dropped by the next beat of
# any worker (a crashed process never removes its own).
FORGET_AFTER = timedelta(days=1)


class Presence:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        worker_id: str,
        job_types: Sequence[str],
        interval: float,
    ) -> None:
        self._sessions = sessions
        self._worker_id = worker_id
        self._job_types = sorted(job_types)
        self._interval = interval
        self._started_at = datetime.now(UTC)
        self._failing = False

    async def beat(self) -> None:
        """Upsert this process's row (and forget long-silent workers)."""
        row = {
            "worker_id": self._worker_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "job_types": self._job_types,
            "started_at": self._started_at,
            "heartbeat_at": func.now(),
            "beat_seconds": self._interval,
        }
        upsert = insert(WorkerPresence).values(row)
        upsert = upsert.on_conflict_do_update(
            index_elements=[WorkerPresence.worker_id],
            set_={
                "heartbeat_at": func.now(),
                "job_types": upsert.excluded.job_types,
                "beat_seconds": upsert.excluded.beat_seconds,
            },
        )
        async with self._sessions() as session, session.begin():
            await session.execute(upsert)
            await session.execute(
                delete(WorkerPresence).where(
                    WorkerPresence.heartbeat_at < func.now() - FORGET_AFTER
                )
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Beat every `interval` until `stop`, then remove the row (best effort: a row left
        behind reads as a silent worker, and is forgotten after a day)."""
        try:
            while not stop.is_set():
                await self._beat_logged()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._interval)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._leave())

    async def _beat_logged(self) -> None:
        try:
            await self.beat()
        except Exception as exc:
            # The consumer's breaker already reports an unreachable database: one line
            # when the beats start failing, one when they recover.
            if not self._failing:
                log.info(
                    "presence beat failed", extra={"fields": {"error": cause_chain(exc)[:300]}}
                )
            self._failing = True
            return
        if self._failing:
            log.info("presence beat recovered")
        self._failing = False

    async def _leave(self) -> None:
        async with self._sessions() as session, session.begin():
            await session.execute(
                delete(WorkerPresence).where(WorkerPresence.worker_id == self._worker_id)
            )
