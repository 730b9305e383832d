"""Network partitions between a worker, the relay or the recovery service and PostgreSQL:
connections stay open, bytes go nowhere, no reset ever comes (a TCP proxy that stops
forwarding). Without bounds on the database waits, such a process hangs in its statement
until TCP gives up — tens of minutes, or for good on a stranded connection — with its work
held: a worker keeps its deliveries unacked (the broker never gives them to another
worker), the relay publishes nothing, the recovery service sweeps nothing. With them
(WORKER_/RELAY_/RECOVERY_DATABASE_TIMEOUT_SECONDS), the silence is an outage like a reset:
the worker gives its deliveries back and another finishes them, the relay and the recovery
service connect again, and all go on once healed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.types import JobType
from tests.faults.harness import (
    FaultStack,
    Figures,
    job_rows,
    json_lines,
    record,
    seed,
    statuses,
)
from tests.procs import ServiceProcess
from tests.recovery.seed import Seed, ask_for_sweeps, sweep_request, utcnow
from tests.tcp_proxy import TcpProxy
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(240)]

TIMEOUT = 2.0  # the services' database timeout in these tests (10 s by default)


async def test_a_worker_cut_off_from_postgres_gives_its_deliveries_back_to_another(
    stack: FaultStack, db: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    jobs = 8
    with TcpProxy(stack.db_url) as proxy:
        stack.start("relay")
        cut_off = stack.start(
            "ai-worker",
            DATABASE_URL=proxy.url,
            WORKER_PREFETCH="20",
            WORKER_DATABASE_TIMEOUT_SECONDS=str(TIMEOUT),
        )
        await _consuming(cut_off)
        proxy.freeze()
        frozen_at = time.monotonic()
        # The cut-off worker is the only consumer: every message goes to it first.
        seeded = await seed(db, jobs, [JobType.CARD_ANALYSIS], label="partition")
        await eventually(
            lambda: _all_published(db),
            within=30,
            what="every job's message published",
            context=lambda: stack.logs(),
        )
        other = stack.start("ai-worker", WORKER_PREFETCH="20")

        async def finished_by_the_other() -> bool:
            rows = (await job_rows(db, seeded.job_ids)).values()
            return all(r["status"] == "COMPLETED" for r in rows)

        await eventually(
            finished_by_the_other,
            within=60,
            what="the other worker finishing the cut-off worker's jobs",
            interval=0.2,
            context=lambda: stack.logs(tail=2500),
        )
        healed = time.monotonic() - frozen_at
        rows = (await job_rows(db, seeded.job_ids)).values()
        assert all(f":{other.popen.pid}:" in (r["worker_id"] or "") for r in rows), rows
        # It gave them back through the outage path (released, requeued), not by dying,
        # and stopped taking new ones (the breaker).
        assert _logged(cut_off, "database unavailable; job requeued")
        assert _logged(cut_off, "database unreachable; consuming stopped until it answers")
        assert cut_off.popen.poll() is None, "the cut-off worker died instead of waiting"

        # Healed: with the other worker gone, the cut-off one takes up work again.
        proxy.thaw()
        other.terminate(timeout=20)
        more = await seed(db, 3, [JobType.CARD_ANALYSIS], label="healed")

        async def finished_by_the_healed() -> bool:
            rows = (await job_rows(db, more.job_ids)).values()
            return all(
                r["status"] == "COMPLETED" and f":{cut_off.popen.pid}:" in (r["worker_id"] or "")
                for r in rows
            )

        await eventually(
            finished_by_the_healed,
            within=60,
            what="the healed worker completing new jobs",
            interval=0.2,
            context=lambda: cut_off.log()[-3000:],
        )
        assert _logged(cut_off, "database answers again; consuming")
    assert await statuses(db, [*seeded.job_ids, *more.job_ids]) == {"COMPLETED": jobs + 3}
    record(
        Figures(
            test="worker partitioned from PostgreSQL (no reset), a second worker",
            jobs=jobs,
            fault=f"TCP proxy stops forwarding; WORKER_DATABASE_TIMEOUT_SECONDS={TIMEOUT:g}",
            completed=jobs,
            lost=0,
            duplicated=0,
            time_to_heal_s=round(healed, 1),
        ),
        tmp_path,
    )


async def test_a_relay_whose_connections_go_silent_connects_again_and_publishes(
    stack: FaultStack, db: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    """The relay's connections are stranded (a failover to a new address, a NAT that
    forgot them): the old ones stay open and silent, new ones work. Its listener is one of
    them: the relay must not be left polling on a deaf one."""
    with TcpProxy(stack.db_url) as proxy:
        relay = stack.start(
            "relay",
            DATABASE_URL=proxy.url,
            RELAY_DATABASE_TIMEOUT_SECONDS=str(TIMEOUT),
            RELAY_POLL_SECONDS="3",
        )
        stack.start("ai-worker")
        before = await seed(db, 3, [JobType.CARD_ANALYSIS], label="before")
        await _completed(db, before.job_ids, stack)
        listeners = await _listeners(db)
        assert len(listeners) == 1, listeners

        proxy.strand()
        stranded_at = time.monotonic()
        after = await seed(db, 5, [JobType.CARD_ANALYSIS], label="stranded")
        await _completed(db, after.job_ids, stack)
        healed = time.monotonic() - stranded_at
        # A new listener beside the stranded one (its server side lives on, as a partitioned
        # client's would): the relay does not wait for polls from now on.
        now = await _listeners(db)
        assert len(now) == 2 and set(listeners) < set(now), (listeners, now)
        assert _logged(relay, "LISTEN connection lost; listening again")
        assert relay.popen.poll() is None
    record(
        Figures(
            test="relay's connections to PostgreSQL stranded (no reset; new ones work)",
            jobs=5,
            fault=f"TCP proxy strands open connections; RELAY_DATABASE_TIMEOUT_SECONDS={TIMEOUT:g}",
            completed=5,
            lost=0,
            duplicated=0,
            time_to_heal_s=round(healed, 1),
        ),
        tmp_path,
    )


async def test_a_recovery_service_whose_connections_go_silent_runs_the_next_sweeps(
    stack: FaultStack, db: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    """The recovery service's pooled connections are stranded while it waits between
    polls. Unbounded, its next poll would wait on a connection that never answers, for
    good, and no sweep would run again — scheduled or asked for. Bounded
    (RECOVERY_DATABASE_TIMEOUT_SECONDS), the poll fails, the pool connects anew and the
    operator's next "run now" is run: the ghost job it finds is revived, and completes."""
    with TcpProxy(stack.db_url) as proxy:
        recovery = stack.start(
            "recovery",
            DATABASE_URL=proxy.url,
            RECOVERY_DATABASE_TIMEOUT_SECONDS=str(TIMEOUT),
            RECOVERY_REQUEST_POLL_SECONDS="0.5",
            # its lease rescuer would take the ghost below back first (same attempt): out
            # of the way after its first round, so the sweep is what is exercised
            RECOVERY_RESCUE_SECONDS="3600",
        )
        before = await ask_for_sweeps(db, ["ghost", "failed"])
        assert await _answered(db, before, stack) is True

        proxy.strand()
        stranded_at = time.monotonic()
        # a worker that died holding a job, long ago: what the ghost sweep exists for
        ghosts = Seed(db, utcnow())
        user_id = await ghosts.user()
        scrap_id = await ghosts.scrap(user_id)
        ghost = await ghosts.job(
            JobType.CARD_ANALYSIS,
            scrap_id,
            user_id,
            status="PROCESSING",
            started=ghosts.ago(hours=3),
            lease_until=ghosts.ago(hours=3),
        )
        after = await ask_for_sweeps(db, ["ghost", "failed"])
        assert await _answered(db, after, stack) is True
        assert await ghosts.revived({ghost}) == {(JobType.CARD_ANALYSIS, scrap_id, 2)}
        assert recovery.popen.poll() is None
    # and the revived job runs, under its own id
    stack.start("relay")
    stack.start("ai-worker")
    await _completed(db, [ghost], stack)
    healed = time.monotonic() - stranded_at
    record(
        Figures(
            test="recovery's connections to PostgreSQL stranded (no reset; new ones work)",
            jobs=1,
            fault=(
                "TCP proxy strands open connections; "
                f"RECOVERY_DATABASE_TIMEOUT_SECONDS={TIMEOUT:g}; then a ghost job, and 'run now'"
            ),
            completed=1,
            lost=0,
            duplicated=0,
            time_to_heal_s=round(healed, 1),
        ),
        tmp_path,
    )


async def _answered(
    db: async_sessionmaker[AsyncSession], request_id: int, stack: FaultStack
) -> bool | None:
    """Whether request `request_id`'s sweeps all succeeded, once it is finished."""

    async def finished() -> bool:
        return (await sweep_request(db, request_id)).finished_at is not None

    await eventually(
        finished,
        within=60,
        what=f"sweep request {request_id} run",
        interval=0.2,
        context=lambda: stack.logs(tail=2500),
    )
    return (await sweep_request(db, request_id)).ok


async def _consuming(process: ServiceProcess) -> None:
    await eventually(
        lambda: _async_logged(process, "worker consuming"),
        within=60,
        what=f"{process.name} consuming",
        context=lambda: process.log()[-3000:],
    )


async def _completed(
    db: async_sessionmaker[AsyncSession], job_ids: Iterable[uuid.UUID], stack: FaultStack
) -> None:
    ids = list(job_ids)

    async def done() -> bool:
        return await statuses(db, ids) == {"COMPLETED": len(ids)}

    await eventually(
        done, within=60, what=f"{len(ids)} jobs completed", context=lambda: stack.logs(tail=2500)
    )


async def _all_published(db: async_sessionmaker[AsyncSession]) -> bool:
    async with db() as session:
        left = await session.scalar(
            text("SELECT count(*) FROM outbox_messages WHERE published_at IS NULL")
        )
    return int(left or 0) == 0


async def _listeners(db: async_sessionmaker[AsyncSession]) -> list[int]:
    """The backends of this database whose last statement was the relay's LISTEN (the
    workers' cancel listeners LISTEN too, on a channel of their own)."""
    async with db() as session:
        rows = await session.scalars(
            text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN%' AND query LIKE '%san_outbox%' ORDER BY backend_start"
            )
        )
        return list(rows.all())


def _logged(process: ServiceProcess, message: str) -> bool:
    return any(line.get("msg") == message for line in json_lines(process.log()))


async def _async_logged(process: ServiceProcess, message: str) -> bool:
    return _logged(process, message)
