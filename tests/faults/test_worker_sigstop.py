"""Acceptance 2 of issue 9: of two ai-workers, one is SIGSTOPped for longer than its lease
while it holds jobs. The other finishes them within lease + 15 s; after SIGCONT the paused
worker's late results reach the database and are rejected by the fencing token: nothing
it writes changes a job row or adds a card."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.types import JobType
from tests.faults.harness import (
    FaultStack,
    Figures,
    card_ids,
    held_by,
    job_rows,
    jobs_for_targets,
    json_lines,
    pause,
    record,
    resume,
    run_sql,
    seed,
    statuses,
    try_rows,
)
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(240)]

JOBS = 6
LEASE = 10.0

# Counts every INSERT a store makes into knowledge_cards, committed or rolled back: a
# sequence is not transactional, so a late store that is rolled back still counts. This is
# how the test sees the paused worker's write reach the database.
COUNT_CARD_STORES = """
CREATE SEQUENCE faults_card_stores;
CREATE FUNCTION faults_count_card_store() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('faults_card_stores');
    RETURN NEW;
END $$;
CREATE TRIGGER faults_count_card_store BEFORE INSERT ON knowledge_cards
    FOR EACH ROW EXECUTE FUNCTION faults_count_card_store();
"""


async def test_a_paused_workers_jobs_are_taken_over_and_its_late_results_rejected(
    stack: FaultStack, db: async_sessionmaker[AsyncSession], tmp_path: Path
) -> None:
    worker_env = {"WORKER_PREFETCH": "20", "WORKER_LEASE_SECONDS": str(LEASE)}
    await run_sql(stack.db_url, COUNT_CARD_STORES)
    stack.start("relay")
    stack.start("recovery")  # the maintenance service: its lease rescuer
    paused = stack.start("ai-worker", **worker_env)
    stack.ai.close_gate()
    seeded = await seed(db, JOBS, [JobType.CARD_ANALYSIS], label="sigstop")

    async def paused_holds_all() -> bool:
        return await held_by(db, seeded.job_ids, paused.popen.pid) == JOBS

    await eventually(paused_holds_all, within=60, what="the first worker holding every job")
    other = stack.start("ai-worker", **worker_env)
    await eventually(
        lambda: _logged(other.log(), "worker consuming"), within=60, what="the second worker up"
    )

    pause(paused)
    paused_at = time.monotonic()
    # The answers go out now and wait in the paused worker's socket: on SIGCONT it goes on
    # to store them, late.
    stack.ai.open_gate()

    async def taken_over() -> bool:
        rows = (await job_rows(db, seeded.job_ids)).values()
        return all(
            r["status"] == "COMPLETED" and f":{other.popen.pid}:" in (r["worker_id"] or "")
            for r in rows
        )

    await eventually(
        taken_over,
        within=LEASE + 15,
        what="the other worker finishing every job within lease + 15 s",
        interval=0.2,
        context=lambda: stack.logs(tail=1500),
    )
    healed = time.monotonic() - paused_at
    # Paused for longer than its lease, whatever the takeover took.
    if (left := LEASE + 1 - (time.monotonic() - paused_at)) > 0:
        await asyncio.sleep(left)
    before_jobs = await job_rows(db, seeded.job_ids)
    before_cards = await card_ids(db, seeded.scrap_ids)
    assert all(len(ids) == 1 for ids in before_cards.values()) and len(before_cards) == JOBS
    stores_before = await _card_stores(db)

    resume(paused)
    late = {str(j) for j in seeded.job_ids}

    async def late_results_rejected() -> bool:
        rejected = {
            line.get("job_id")
            for line in json_lines(paused.log())
            if "lease lost" in str(line.get("msg", ""))
        }
        return late <= rejected

    await eventually(
        late_results_rejected,
        within=60,
        what="the paused worker's late results rejected",
        context=lambda: paused.log()[-3000:],
    )
    assert paused.popen.poll() is None, "the paused worker died instead of going on"
    # Its late stores reached the database (one INSERT per job)…
    assert await _card_stores(db) - stores_before == JOBS
    # … and changed nothing: same job rows (status, try, worker, times), same cards.
    assert await job_rows(db, seeded.job_ids) == before_jobs
    assert await card_ids(db, seeded.scrap_ids) == before_cards
    assert await statuses(db, seeded.job_ids) == {"COMPLETED": JOBS}
    assert await jobs_for_targets(db, seeded.scrap_ids) == JOBS
    tries = await try_rows(db, seeded.job_ids)
    lost = [t for t in tries if f":{paused.popen.pid}:" in (t["worker_id"] or "")]
    won = [t for t in tries if f":{other.popen.pid}:" in (t["worker_id"] or "")]
    assert sorted(t["outcome"] for t in lost) == ["lease_lost"] * JOBS, tries
    assert sorted(t["outcome"] for t in won) == ["completed"] * JOBS, tries
    record(
        Figures(
            test="worker SIGSTOP beyond its lease, SIGCONT after takeover",
            jobs=JOBS,
            fault=f"SIGSTOP of the worker holding all {JOBS} jobs for > lease ({LEASE:.0f} s)",
            completed=JOBS,
            lost=0,
            duplicated=0,
            time_to_heal_s=round(healed, 1),
        ),
        tmp_path,
    )


async def _card_stores(db: async_sessionmaker[AsyncSession]) -> int:
    async with db() as session:
        value = await session.scalar(
            text("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM faults_card_stores")
        )
    return int(value or 0)


async def _logged(log: str, message: str) -> bool:
    return any(line.get("msg") == message for line in json_lines(log))
