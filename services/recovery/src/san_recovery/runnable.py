"""The scaling signal: per job queue, the jobs a worker could run now
(`san_queue_runnable_jobs`, which the KEDA ScaledObjects of deploy/k8s scale the workers
on; docs/operations.md, "Scaling on runnable work").

Every `RECOVERY_RUNNABLE_SECONDS`, per queue:

    runnable = ready in the queue (the broker) + due in the outbox (not published yet)
               + running (PROCESSING) − due jobs their upstream quota has no room for

A queue's length alone says how much work there is, not how much more workers could do.
A job waiting for an upstream quota or its user's budget is not in the queue: its try
ended, and its next message waits in the outbox, due at the reset (`async_jobs.waiting_for`,
`next_attempt_at`); it is not counted until then. At the reset every job that waited for
that quota is due at once, while the quota admits only what is left of it: the jobs beyond
its room (its requests left, or its limit once the window ended; an unknown limit holds
nothing back) are left out too. Running jobs count, as the broker's count of
unacknowledged messages did: a busy worker is still needed.

Each replica of the maintenance service measures and exports its own value; the triggers
read their `max`. Without the broker a round measures nothing and the gauge keeps its last
value (the outage is logged once).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import metrics
from san_common.broker.depths import QueueDepths
from san_common.broker.topology import Topology
from san_common.jobs import registry
from san_common.outages import BROKER

# $1 the queue's job types (its routing keys). The room of a quota is what `quotas._RESERVE`
# would find: the window's requests left, or its whole limit once the window ended.
_MEASURE = """
SELECT
    (SELECT count(*) FROM outbox_messages
        WHERE published_at IS NULL AND available_at <= now() AND routing_key = ANY($1)
    ) AS due,
    (SELECT count(*) FROM async_jobs WHERE status = 'PROCESSING' AND job_type = ANY($1)
    ) AS running,
    (SELECT coalesce(sum(greatest(w.due - w.room, 0)), 0) FROM (
        SELECT count(*) AS due,
            min(CASE WHEN q.requests_reset_at IS NULL OR q.requests_reset_at <= now()
                THEN q.requests_limit ELSE q.requests_remaining END) AS room
        FROM async_jobs AS j
        JOIN upstream_quotas AS q ON q.key = j.waiting_key
        WHERE j.status = 'PENDING' AND j.waiting_for = 'upstream-quota'
          AND j.next_attempt_at <= now() AND j.job_type = ANY($1)
        GROUP BY q.key
    ) AS w WHERE w.room IS NOT NULL) AS beyond_quota,
    (SELECT count(*) FROM async_jobs
        WHERE status = 'PENDING' AND waiting_for IS NOT NULL AND next_attempt_at > now()
          AND job_type = ANY($1)
    ) AS waiting
"""


@dataclass(frozen=True)
class Runnable:
    """One queue's measure: the parts and the jobs waiting (not counted in them)."""

    queue: str
    ready: int
    due: int
    running: int
    beyond_quota: int
    waiting: int

    @property
    def runnable(self) -> int:
        return max(0, self.ready + self.due + self.running - self.beyond_quota)


class RunnableGauge:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        depths: QueueDepths,
        topology: Topology,
    ) -> None:
        self._sessions = sessions
        self._depths = depths
        self._topology = topology

    def queues(self) -> dict[str, list[str]]:
        by_queue: dict[str, list[str]] = defaultdict(list)
        for job_type in registry.job_types():
            by_queue[self._topology.queue_name(job_type)].append(job_type)
        return dict(by_queue)

    async def run_once(self) -> list[Runnable]:
        """Measure every queue and set the gauges; without the broker, nothing is set."""
        began = time.monotonic()
        measured: list[Runnable] = []
        for queue, job_types in self.queues().items():
            try:
                depth = await self._depths.read(queue)
            except Exception as exc:
                BROKER.lost(exc, "reading the job queues' depths")
                return measured
            measured.append(await self.measure(queue, job_types, depth.ready if depth else 0))
        BROKER.answered(began)
        for one in measured:
            metrics.QUEUE_RUNNABLE.labels(one.queue).set(one.runnable)
            metrics.QUEUE_WAITING.labels(one.queue).set(one.waiting)
        return measured

    async def measure(self, queue: str, job_types: list[str], ready: int) -> Runnable:
        async with self._sessions() as session, session.begin():
            connection = await session.connection()
            row = (await connection.exec_driver_sql(_MEASURE, (job_types,))).one()
        return Runnable(
            queue, ready, int(row.due), int(row.running), int(row.beyond_quota), int(row.waiting)
        )
