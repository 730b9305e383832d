"""The lease rescuer: PROCESSING jobs whose lease expired (their worker was killed, paused
or cut off) become claimable again within seconds, under the same job id, with a new
message — like River's job rescuer or Oban's lifeline, not a once-an-hour janitor.

A maintenance task (every `RECOVERY_RESCUE_SECONDS`); `FOR UPDATE SKIP LOCKED` makes
replicas take disjoint jobs and skip a job a worker is settling that very moment. The job
goes back to PENDING (`lifecycle.rescue_expired`: its target row's mirrored status too) and
the lost try ends `lease_lost`; the next claim increments `tries`, so whatever the lost
worker writes later is fenced out. The new outbox row wakes the relay (its trigger NOTIFYs
at commit). A job that keeps losing its worker spends its tries: the worker that claims it
after the last one fails it.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs import lifecycle

log = logging.getLogger(__name__)


class LeaseRescuer:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], *, batch_size: int) -> None:
        self._sessions = sessions
        self._batch = batch_size

    async def run_once(self) -> int:
        """Rescue every expired lease, a batch per transaction; how many were rescued."""
        total = 0
        while (rescued := await self.rescue_once()) >= self._batch:
            total += rescued
        return total + rescued

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
        return len(rescued)
