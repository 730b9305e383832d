"""The stranded-message check: every PENDING job that is due has a message on its way.

A confirmed outbox row means the broker had the message once; a queue purge, a consumer
that is not ours acking it, or a lost queue can still take it away, and the job would wait
for the ghost sweep. Per job queue, every `RECOVERY_STRANDED_SECONDS`:

1. U — the messages of the queue's job types still in the outbox, due by the cutoff
   (the database's clock minus `RECOVERY_STRANDED_GRACE_SECONDS`);
2. D — the messages ready in the queue (the broker's answer to a passive declare);
3. P — the PENDING jobs of those types that have been waiting for a delivery since before
   the cutoff, counted after D was read.

Read in that order, every job of P whose message exists is counted in U or D, or its
message has been delivered and the job is about to be claimed (a worker claims as it
receives; a delivery waits unclaimed only while its worker's slots are full). So P − D − U
bounds the jobs without a message from above. The queue is first in, first out: messages
that are gone were the oldest ones (a foreign consumer, like ours, takes the head), so the
P − D − U jobs that waited longest are the suspects. A suspect is re-published only when
the previous check suspected it too, unchanged: a delivery waiting for a slot is claimed
by then, a lost message is not. Re-publishing adds an outbox row (the relay publishes it;
this service never publishes), writes the reason into `last_error` and moves `updated_at`,
so the job waits a full grace again before it can be suspected again.

The grace covers the relay's lag and a round that committed after its broker confirm; the
second sighting covers deliveries sitting in a worker's buffer. Messages that do not belong
to a PENDING job (duplicates, finished jobs) only make D larger: the check then waits for
the workers to drain them, it never re-publishes more. One replica checks a queue at a
time (an advisory lock per queue); `FOR UPDATE SKIP LOCKED` and the `updated_at` fence keep
a job from being re-published twice.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import metrics
from san_common.broker.depths import QueueDepths
from san_common.broker.topology import Topology
from san_common.jobs import outbox, registry
from san_common.jobs.admission import Priority
from san_common.outages import BROKER
from san_recovery import repository

log = logging.getLogger(__name__)

NOTE = "message re-published: it was no longer in its queue"


@dataclass(frozen=True)
class QueueCheck:
    """What one check of one queue saw and did (logged when it re-published)."""

    queue: str
    unpublished: int
    ready: int
    waiting: int
    suspects: int
    republished: int


class StrandedCheck:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        depths: QueueDepths,
        topology: Topology,
        *,
        grace: timedelta,
    ) -> None:
        self._sessions = sessions
        self._depths = depths
        self._topology = topology
        self._grace = grace
        # per queue: the suspects of the previous check, with the `updated_at` they had
        self._suspects: dict[str, dict[uuid.UUID, datetime]] = {}

    def queues(self) -> dict[str, list[str]]:
        """Each job queue with the job types routed to it."""
        by_queue: dict[str, list[str]] = defaultdict(list)
        for job_type in registry.job_types():
            by_queue[self._topology.queue_name(job_type)].append(job_type)
        return dict(by_queue)

    async def run_once(self) -> int:
        """Check every queue; how many jobs were re-published. Without the broker there
        is nothing to compare with: the round ends (logged once per broker outage)."""
        republished = 0
        began = time.monotonic()
        for queue, job_types in self.queues().items():
            try:
                checked = await self.check(queue, job_types)
            except _BrokerUnavailable as unavailable:
                BROKER.lost(unavailable.error, "reading the job queues' depths")
                return republished
            if checked is not None:
                republished += checked.republished
        BROKER.answered(began)
        return republished

    async def check(self, queue: str, job_types: list[str]) -> QueueCheck | None:
        """One check of one queue; None when another replica holds it or the queue does
        not exist (nothing can be delivered from it; the relay keeps its messages)."""
        async with self._sessions() as session, session.begin():
            if not await repository.try_task_lock(session, f"stranded:{queue}"):
                return None
            cutoff, unpublished = await repository.unpublished_messages(
                session, job_types, self._grace
            )
            try:
                depth = await self._depths.read_job_queue(queue)
            except Exception as exc:
                raise _BrokerUnavailable(exc) from exc
            if depth is None:
                self._suspects.pop(queue, None)
                return None
            ready = depth.ready
            waiting = await repository.count_waiting(session, job_types, cutoff)
            missing = waiting - ready - unpublished
            suspects = (
                await repository.longest_waiting(session, job_types, cutoff, missing)
                if missing > 0
                else {}
            )
            before = self._suspects.get(queue, {})
            confirmed = {j: at for j, at in suspects.items() if before.get(j) == at}
            self._suspects[queue] = {j: at for j, at in suspects.items() if j not in confirmed}
            jobs = await repository.mark_republished(session, confirmed, NOTE)
            for job in jobs:
                await outbox.add_job_message(session, job, priority=Priority.BATCH)
        result = QueueCheck(queue, unpublished, ready, waiting, len(suspects), len(jobs))
        if jobs:
            for job in jobs:
                metrics.STRANDED_REPUBLISHED.labels(job.job_type).inc()
            log.warning(
                "jobs without a message in their queue re-published",
                extra={
                    "fields": {
                        "queue": queue,
                        "republished": len(jobs),
                        "waiting": waiting,
                        "ready": ready,
                        "unpublished": unpublished,
                        "consumers": depth.consumers,
                        "job_ids": [str(j.job_id) for j in jobs[:20]],
                    }
                },
            )
        return result


class _BrokerUnavailable(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
