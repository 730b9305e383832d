"""Issue 39: a database outage during the store keeps the result. PostgreSQL (this test's
own server) stops with `pg_ctl -m fast` for 8 s while a burst of card analyses is inside its
AI calls; the answers arrive while it is down. The worker holds each result in memory, its
delivery unacked, and stores it once the server answers: every job completes with one card,
and the AI is asked once per job — given back instead, each interrupted job would run again
and ask again. The ledger counts each call once.

Fencing holds for a held result as for any write: a worker cut off from PostgreSQL (a TCP
proxy that refuses it) holds its results past their lease, the lease rescuer and another
worker take the jobs over, and the held stores, once they get through, write nothing."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.db.engine import bound_engine
from san_common.jobs.types import JobType
from tests import infra
from tests.faults.harness import (
    FaultStack,
    Figures,
    cards_per_scrap,
    job_rows,
    json_lines,
    log_problems,
    record,
    seed,
    statuses,
)
from tests.faults.postgres import DedicatedPostgres
from tests.procs import ServiceProcess, wait_healthy
from tests.tcp_proxy import TcpProxy
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(240)]

JOBS = 60
IN_FLIGHT = 20  # the worker's prefetch: the jobs inside their AI call when it strikes
DOWN_SECONDS = 8.0
STARTED = "PostgreSQL unreachable; retrying until it answers"
HELD = "database unavailable; result held until it answers"
NOT_STORED = "held result not stored: its try no longer holds the job"
CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"


async def test_results_held_through_a_postgres_stop_are_stored_without_asking_the_ai_again(
    own_stack: FaultStack,
    own_db: async_sessionmaker[AsyncSession],
    own_postgres: DedicatedPostgres,
    tmp_path: Path,
) -> None:
    stack, db = own_stack, own_db
    stack.start("relay")
    stack.start("recovery")  # its lease rescuer: were a lease to run out, it would act
    probe = infra.free_port()
    worker = stack.start(
        "ai-worker",
        WORKER_PREFETCH=str(IN_FLIGHT),
        WORKER_LEASE_SECONDS="20",
        PROBE_PORT=str(probe),
    )
    metrics_url = f"http://127.0.0.1:{probe}"
    await asyncio.to_thread(wait_healthy, metrics_url, worker)
    stack.ai.close_gate()
    seeded = await seed(db, JOBS, [JobType.CARD_ANALYSIS], label="held")

    async def burst_in_flight() -> bool:
        return stack.ai.held() >= IN_FLIGHT

    await eventually(
        burst_in_flight, within=60, what="the first jobs inside their AI call", context=stack.logs
    )
    await bound_engine(db).dispose()  # the test's own pool would only hold dead connections
    since = _now_iso()
    await asyncio.to_thread(own_postgres.stop_fast)
    stack.ai.open_gate()  # the answers arrive while the database is down
    await asyncio.sleep(DOWN_SECONDS)  # the outage's length, a property of the fault
    held_during = await _metric(metrics_url, "san_worker_held_results")
    await asyncio.to_thread(own_postgres.start)
    started_at = time.monotonic()

    async def all_completed() -> bool:
        return (await statuses(db, seeded.job_ids)).get("COMPLETED", 0) == JOBS

    await eventually(
        all_completed, within=150, what="every job completed after the restart", interval=0.5,
        context=lambda: stack.logs(tail=2000),
    )  # fmt: skip
    healed = time.monotonic() - started_at
    assert await statuses(db, seeded.job_ids) == {"COMPLETED": JOBS}
    cards = await cards_per_scrap(db, seeded.scrap_ids)
    assert sorted(cards.values()) == [1] * JOBS, cards
    # The AI was asked once per job: no held result was given back and run again.
    asked = stack.ai.passed(CHAT)
    assert asked == JOBS, f"{asked - JOBS} re-asks of the AI in {JOBS} jobs"
    assert stack.ai.passed(EMBEDDINGS) == JOBS
    rows = (await job_rows(db, seeded.job_ids)).values()
    assert {r["tries"] for r in rows} == {1}, sorted(r["tries"] for r in rows)
    # The ledger has each job's two calls once, those written after the outage included.
    assert await _ledger_calls(db, seeded.job_ids) == {(1, "chat", 1), (1, "embedding", 1)}
    assert held_during == IN_FLIGHT, worker.log()[-3000:]
    assert _count(worker, HELD, since) == IN_FLIGHT
    assert await _metric(metrics_url, "san_worker_held_results") == 0
    stored = 'san_worker_results_held_total{job_type="CARD_ANALYSIS",outcome="stored"}'
    assert await _metric(metrics_url, stored) == IN_FLIGHT
    # One WARNING for the outage, not one per held result or heartbeat; nothing escaped.
    loud = [r.get("msg") for r in _records(worker, since) if r.get("level") == "warning"]
    assert loud == [STARTED], loud
    problems = log_problems(worker.log())
    assert not problems, "\n".join(problems[:20])
    record(
        Figures(
            test="PostgreSQL fast stop during the store: results held",
            jobs=JOBS,
            fault=f"pg_ctl -m fast stop, {DOWN_SECONDS:.0f} s down with {IN_FLIGHT} "
            f"answers arriving, start; AI re-asks: {asked - JOBS}",
            completed=JOBS,
            lost=0,
            duplicated=sum(c - 1 for c in cards.values()),
            time_to_heal_s=round(healed, 1),
        ),
        tmp_path,
    )


async def test_a_result_held_past_its_lease_writes_nothing_once_the_job_is_taken_over(
    stack: FaultStack, db: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    jobs = 3
    with TcpProxy(stack.db_url) as proxy:
        stack.start("relay")
        stack.start("recovery", RECOVERY_RESCUE_SECONDS="0.5")
        cut_off = stack.start(
            "ai-worker",
            DATABASE_URL=proxy.url,
            WORKER_LEASE_SECONDS="3",
            WORKER_DATABASE_TIMEOUT_SECONDS="2",
        )
        stack.ai.close_gate()
        seeded = await seed(db, jobs, [JobType.CARD_ANALYSIS], label="fenced")

        async def inside_their_call() -> bool:
            return stack.ai.held() >= jobs

        await eventually(
            inside_their_call, within=60, what="the jobs inside their AI call",
            context=stack.logs,
        )  # fmt: skip
        proxy.cut()  # resets its connections and refuses new ones: only this worker's
        stack.ai.open_gate()

        async def held() -> bool:
            return _count(cut_off, HELD) == jobs

        await eventually(
            held, within=30, what="the cut-off worker holding every result",
            context=lambda: cut_off.log()[-3000:],
        )  # fmt: skip
        # Their leases run out; the rescuer gives the jobs back and another worker runs
        # them (and asks the AI again: the first answers are in the cut-off worker only).
        other = stack.start("ai-worker")

        async def taken_over() -> bool:
            rows = (await job_rows(db, seeded.job_ids)).values()
            return all(
                r["status"] == "COMPLETED" and f":{other.popen.pid}:" in (r["worker_id"] or "")
                for r in rows
            )

        await eventually(
            taken_over, within=60, what="the other worker completing the jobs", interval=0.2,
            context=lambda: stack.logs(tail=2500),
        )  # fmt: skip
        before = await _cards(db, seeded.scrap_ids)
        jobs_before = await job_rows(db, seeded.job_ids)
        proxy.restore()

        async def fenced_out() -> bool:
            return _count(cut_off, NOT_STORED) == jobs

        await eventually(
            fenced_out, within=30, what="the held stores answered, fenced out",
            context=lambda: cut_off.log()[-3000:],
        )  # fmt: skip
        assert cut_off.popen.poll() is None
    # Nothing of the held stores was written: the cards are the other worker's, one each.
    assert await _cards(db, seeded.scrap_ids) == before
    assert await job_rows(db, seeded.job_ids) == jobs_before
    assert sorted(len(ids) for ids in before.values()) == [1] * jobs
    assert await statuses(db, seeded.job_ids) == {"COMPLETED": jobs}
    assert stack.ai.passed(CHAT) == 2 * jobs  # each job's try 1 (held, lost) and try 2
    # Both answers were paid for: each try's calls are in the ledger, once.
    assert await _ledger_calls(db, seeded.job_ids) == {
        (1, "chat", 1), (1, "embedding", 1), (2, "chat", 1), (2, "embedding", 1),
    }  # fmt: skip
    problems = log_problems(cut_off.log())
    assert not problems, "\n".join(problems[:20])
    record(
        Figures(
            test="held results past their lease, job taken over: fenced",
            jobs=jobs,
            fault="TCP proxy refuses one worker; WORKER_LEASE_SECONDS=3; rescue, second worker",
            completed=jobs,
            lost=0,
            duplicated=0,
            time_to_heal_s=0.0,
        ),
        tmp_path,
    )


# -- helpers ---------------------------------------------------------------------------------


async def _ledger_calls(
    db: async_sessionmaker[AsyncSession], job_ids: list[uuid.UUID]
) -> set[tuple[int, str, int]]:
    """The distinct (try, call, rows of that try and call per job) over `job_ids`: a call
    counted twice shows as a 2, a job missing a call as a missing row (checked by count)."""
    async with db() as session:
        result = await session.execute(
            text(
                "SELECT job_id, try_no, call, count(*) AS n FROM ai_usage"
                " WHERE job_id = ANY(:ids) GROUP BY 1, 2, 3"
            ),
            {"ids": list(job_ids)},
        )
        rows = result.all()
    per_key: dict[tuple[int, str], int] = {}
    for row in rows:
        per_key[(row.try_no, row.call)] = per_key.get((row.try_no, row.call), 0) + 1
    assert all(count == len(job_ids) for count in per_key.values()), per_key
    return {(row.try_no, row.call, int(row.n)) for row in rows}


async def _cards(
    db: async_sessionmaker[AsyncSession], scrap_ids: list[uuid.UUID]
) -> dict[uuid.UUID, list[str]]:
    async with db() as session:
        result = await session.execute(
            text(
                "SELECT scrap_id, array_agg(id::text || ':' || created_at::text ORDER BY id)"
                " AS cards FROM knowledge_cards WHERE scrap_id = ANY(:ids) GROUP BY scrap_id"
            ),
            {"ids": list(scrap_ids)},
        )
        return {row.scrap_id: list(row.cards) for row in result}


async def _metric(base_url: str, series: str) -> float | None:
    async with httpx.AsyncClient(timeout=5) as client:
        body = (await client.get(f"{base_url}/metrics")).text
    match = re.search(rf"^{re.escape(series)} ([0-9.e+-]+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else None


def _records(process: ServiceProcess, since: str) -> list[dict[str, Any]]:
    return [line for line in json_lines(process.log()) if str(line.get("ts", "")) >= since]


def _count(process: ServiceProcess, message: str, since: str = "") -> int:
    return sum(1 for line in _records(process, since) if line.get("msg") == message)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
