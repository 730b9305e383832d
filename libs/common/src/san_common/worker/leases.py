"""One heartbeat for every job a worker process runs.

Each running job's lease is renewed every `interval` (a third of the lease) by one loop
that asks the store to extend all of them at once — one statement for the whole process
(SqlJobStore batches the calls), instead of a task and a transaction per job. A job is
first renewed at the tick after its claim, well within its lease. A try the store no
longer finds holding its job (taken over after a stall) is dropped with one warning: its
result will not count, whatever it does (its writes are fenced).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from san_common.errors import cause_chain, is_connection_loss
from san_common.outages import DATABASE

if TYPE_CHECKING:
    from san_common.worker.store import Claim, JobStore

log = logging.getLogger("san_common.worker")


class LeaseKeeper:
    def __init__(self, store: JobStore, lease: timedelta, interval: float) -> None:
        self._store = store
        self._lease = lease
        self._interval = interval
        self._held: dict[uuid.UUID, Claim] = {}
        self._beating: asyncio.Task[None] | None = None

    def hold(self, claim: Claim) -> None:
        """Renew `claim`'s lease from the next tick on, until `release`."""
        self._held[claim.job.job_id] = claim
        if self._beating is None:
            self._beating = asyncio.create_task(self._beat())

    def release(self, claim: Claim) -> None:
        if self._held.get(claim.job.job_id) is claim:
            del self._held[claim.job.job_id]

    async def _beat(self) -> None:
        try:
            while self._held:  # ends when nothing runs; the next `hold` starts it again
                await asyncio.sleep(self._interval)
                claims = list(self._held.values())
                results = await asyncio.gather(
                    *(self._store.extend(c, self._lease) for c in claims), return_exceptions=True
                )
                failure = next((r for r in results if isinstance(r, BaseException)), None)
                if failure is not None and is_connection_loss(failure):
                    # The outage's one WARNING (san_common.outages), not one a beat: results
                    # held through it keep their claims here (executor, "Held results").
                    DATABASE.lost(failure, "renewing leases")
                elif failure is not None:  # a missed beat is survivable: the next may get through
                    log.warning(
                        "heartbeat failed", extra={"fields": {"error": cause_chain(failure)[:500]}}
                    )
                for claim, held in zip(claims, results, strict=True):
                    if held is False and self._held.get(claim.job.job_id) is claim:
                        with_job = {"job_id": str(claim.job.job_id), "try": claim.try_no}
                        log.warning(
                            "heartbeat found the job taken over; its result will not count",
                            extra={"fields": with_job},
                        )
                        self.release(claim)
        finally:
            self._beating = None
