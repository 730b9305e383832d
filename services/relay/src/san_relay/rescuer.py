"""The lease rescuer: PROCESSING jobs whose lease expired (their worker was killed, paused
or cut off) become claimable again within seconds, under the same job id, with a new
message — like River's job rescuer or Oban's lifeline, not a once-an-hour janitor.

Runs in every relay replica every `RELAY_RESCUE_SECONDS`; `FOR UPDATE SKIP LOCKED` makes
replicas take disjoint jobs and skip a job a worker is settling that very moment. The job
goes back to PENDING (`lifecycle.rescue_expired`: its target row's mirrored status too) and
the lost try ends `lease_lost`; the next claim increments `tries`, so whatever the lost
worker writes later is fenced out. A job that keeps losing its worker spends its tries:
the worker that claims it after the last one fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs import lifecycle

log = logging.getLogger(__name__)


class LeaseRescuer:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        interval_seconds: float,
        batch_size: int,
        on_rescued: asyncio.Event | None = None,
    ) -> None:
        self._sessions = sessions
        self._interval = interval_seconds
        self._batch = batch_size
        self._on_rescued = on_rescued

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                while await self.rescue_once() >= self._batch:
                    pass  # a full batch: there may be more
            except Exception:  # the database is away: the next round tries again
                log.warning("lease rescue round failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval)

    async def rescue_once(self) -> int:
        async with self._sessions() as session, session.begin():
            rescued = await lifecycle.rescue_expired(session, limit=self._batch)
        for job in rescued:
            log.info(
                "job rescued: lease expired, claimable again",
                extra={
                    "fields": {
                        "job_id": str(job.job_id),
                        "job_type": job.job_type,
                        "lost_worker": job.worker_id,
                        "spent_tries": job.spent,
                    }
                },
            )
        if rescued and self._on_rescued is not None:
            self._on_rescued.set()  # publish their messages now
        return len(rescued)
