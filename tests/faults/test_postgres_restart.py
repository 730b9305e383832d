"""Acceptance 3 of issue 9: PostgreSQL stops (`pg_ctl -m fast`) and starts again while 100
jobs are in flight, and once it is back the first stores of results lose their connection
(`pg_terminate_backend` of the worker's own backend, inside `store`). Every job completes,
none fails, none is left PROCESSING, and nothing escapes the runtime's error handling.

The server is this test's own (tests/faults/postgres.py), never the suite's shared one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.db.engine import bound_engine
from san_common.jobs.types import JobType
from tests.faults.harness import (
    FaultStack,
    Figures,
    cards_per_scrap,
    jobs_for_targets,
    killing_trigger,
    log_problems,
    record,
    run_sql,
    seed,
    statuses,
)
from tests.faults.postgres import DedicatedPostgres
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(240)]

SCRAPS = 50  # × (CARD_ANALYSIS, SCRAP_REFINE) = 100 jobs
JOBS = 2 * SCRAPS
DOWN_SECONDS = 3.0
KILLED_STORES = 10

# The first KILLED_STORES result writes of either job type terminate their own backend
# mid-statement: the worker's connection dies inside `store`.
KILL_IN_STORE = (
    killing_trigger("faults_kill_store", KILLED_STORES)
    + """
CREATE TRIGGER faults_kill_card_store BEFORE INSERT ON knowledge_cards
    FOR EACH ROW EXECUTE FUNCTION faults_kill_store();
CREATE TRIGGER faults_kill_refine_store BEFORE UPDATE OF refined_content ON scraps
    FOR EACH ROW EXECUTE FUNCTION faults_kill_store();
"""
)


async def test_postgres_fast_restart_and_killed_connections_lose_no_job(
    own_stack: FaultStack,
    own_db: async_sessionmaker[AsyncSession],
    own_db_url: str,
    own_postgres: DedicatedPostgres,
    tmp_path: Path,
) -> None:
    stack, db = own_stack, own_db
    await run_sql(own_db_url, KILL_IN_STORE)
    stack.start("relay")
    stack.start("recovery")  # the maintenance service: its lease rescuer
    worker = stack.start("ai-worker", WORKER_PREFETCH=str(JOBS), WORKER_LEASE_SECONDS="20")
    stack.ai.close_gate()
    seeded = await seed(db, SCRAPS, [JobType.CARD_ANALYSIS, JobType.SCRAP_REFINE], label="pg")

    async def all_in_flight() -> bool:
        return stack.ai.held() >= JOBS

    await eventually(
        all_in_flight, within=60, what="all 100 jobs inside their AI call", context=stack.logs
    )
    await bound_engine(db).dispose()  # the test's own pool would only hold dead connections
    await asyncio.to_thread(own_postgres.stop_fast)
    stack.ai.open_gate()  # the answers arrive while the database is down
    await asyncio.sleep(DOWN_SECONDS)  # the outage's length, a property of the fault
    await asyncio.to_thread(own_postgres.start)
    started_at = time.monotonic()

    async def all_settled() -> bool:
        counts = await statuses(db, seeded.job_ids)
        return counts.get("COMPLETED", 0) + counts.get("FAILED", 0) == JOBS

    await eventually(
        all_settled,
        within=150,
        what="every job settled after the restart",
        interval=0.5,
        context=lambda: stack.logs(tail=2000),
    )
    healed = time.monotonic() - started_at
    assert await statuses(db, seeded.job_ids) == {"COMPLETED": JOBS}
    killed = await run_sql(own_db_url, "SELECT last_value FROM faults_kill_store")
    assert killed >= KILLED_STORES, "the connection kills in store never happened"
    cards = await cards_per_scrap(db, seeded.scrap_ids)
    assert sorted(cards.values()) == [1] * SCRAPS, cards
    assert await jobs_for_targets(db, seeded.scrap_ids) == JOBS
    problems = log_problems(worker.log())
    assert not problems, "\n".join(problems[:20])
    record(
        Figures(
            test="PostgreSQL fast stop/start + killed store connections",
            jobs=JOBS,
            fault=(
                f"pg_ctl -m fast stop, {DOWN_SECONDS:.0f} s down, start; then "
                f"pg_terminate_backend in the first {KILLED_STORES} stores"
            ),
            completed=JOBS,
            lost=0,
            duplicated=sum(c - 1 for c in cards.values()),
            time_to_heal_s=round(healed, 1),
        ),
        tmp_path,
    )
