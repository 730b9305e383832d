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
unacknowledged messages did: a busy worker is still needed. Due messages the relay holds
back by fair share count: fair share orders who goes first, and a queue's window grows
with its consumers, so more workers do admit them sooner.

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

# Every job type's parts in one statement (one scan of the due outbox rows, however many
# queues). The room of a quota is what `quotas._RESERVE` would find: the window's requests
# left, or its whole limit once the window ended.
_MEASURE = """
WITH due AS (
    SELECT routing_key AS job_type, count(*) AS n FROM outbox_messages
    WHERE published_at IS NULL AND available_at <= now()
    GROUP BY routing_key
), running AS (
    SELECT job_type, count(*) AS n FROM async_jobs WHERE status = 'PROCESSING'
    GROUP BY job_type
), waited AS (
    SELECT j.job_type, count(*) AS n,
        min(CASE WHEN q.requests_reset_at IS NULL OR q.requests_reset_at <= now()
            THEN q.requests_limit ELSE q.requests_remaining END) AS room
    FROM async_jobs AS j
    JOIN upstream_quotas AS q ON q.key = j.waiting_key
    WHERE j.status = 'PENDING' AND j.waiting_for = 'upstream-quota'
      AND j.next_attempt_at <= now()
    GROUP BY j.job_type, q.key
), beyond AS (
    SELECT job_type, sum(greatest(n - room, 0)) AS n FROM waited WHERE room IS NOT NULL
    GROUP BY job_type
), waiting AS (
    SELECT job_type, count(*) AS n FROM async_jobs
    WHERE status = 'PENDING' AND waiting_for IS NOT NULL AND next_attempt_at > now()
    GROUP BY job_type
)
SELECT t.job_type, coalesce(due.n, 0) AS due, coalesce(running.n, 0) AS running,
    coalesce(beyond.n, 0) AS beyond_quota, coalesce(waiting.n, 0) AS waiting
FROM unnest($1::text[]) AS t(job_type)
LEFT JOIN due ON due.job_type = t.job_type
LEFT JOIN running ON running.job_type = t.job_type
LEFT JOIN beyond ON beyond.job_type = t.job_type
LEFT JOIN waiting ON waiting.job_type = t.job_type
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
        ready: dict[str, int] = {}
        queues = self.queues()
        for queue in queues:
            try:
                depth = await self._depths.read_job_queue(queue)
            except Exception as exc:
                BROKER.lost(exc, "reading the job queues' depths")
                return []
            ready[queue] = depth.ready if depth else 0
        BROKER.answered(began)
        parts = await self.parts([t for types in queues.values() for t in types])
        measured = []
        for queue, types in queues.items():
            due, running, beyond, waiting = (sum(parts[t][i] for t in types) for i in range(4))
            measured.append(Runnable(queue, ready[queue], due, running, beyond, waiting))
        for one in measured:
            metrics.QUEUE_RUNNABLE.labels(one.queue).set(one.runnable)
            metrics.QUEUE_WAITING.labels(one.queue).set(one.waiting)
        return measured

    async def parts(self, job_types: list[str]) -> dict[str, tuple[int, int, int, int]]:
        """Each job type's due, running, beyond-quota and waiting jobs (the database's
        parts; the ready ones are the broker's)."""
        async with self._sessions() as session, session.begin():
            connection = await session.connection()
            rows = (await connection.exec_driver_sql(_MEASURE, (job_types,))).all()
        return {
            r.job_type: (int(r.due), int(r.running), int(r.beyond_quota), int(r.waiting))
            for r in rows
        }
