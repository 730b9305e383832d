"""The worker's claim finds a batch's jobs by their ids whatever the table's statistics say
(`jobs.lifecycle._CLAIM_BATCH`). Under the statistics of a quiet table — few PENDING rows,
as on a fresh start, or before an outage piles up a backlog — the claim's plan (generic, as
the workers' engine asks) read every PENDING row of the backlog through the status indexes
to claim a batch of them: ~8 ms a claim of 14 at 30,000 queued jobs against ~0.4 ms, every
claim, until autovacuum's next ANALYZE. The rows and index entries a statement read in its
transaction tell the two plans apart; the heartbeat's and the completion's statements are
held to the same bound."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from san_common.db.engine import create_engine
from san_common.jobs import lifecycle as jobs

# A backlog large enough that reading it whole is never the planner's cheapest way to the
# state of a batch (it is at ~3,000 rows: a sequential scan).
BACKLOG, BATCH = 20_000, 20
LEASE = timedelta(seconds=30)

_BACKLOG = """
    INSERT INTO async_jobs (job_id, job_type, target_id, user_id)
    SELECT gen_random_uuid(), 'SCRAP_REFINE', gen_random_uuid(), $1
    FROM generate_series(1, $2)
"""
_READ = """
    SELECT pg_stat_get_xact_tuples_returned('async_jobs'::regclass)
        + sum(pg_stat_get_xact_tuples_returned(indexrelid))
    FROM pg_index WHERE indrelid = 'async_jobs'::regclass
"""


@pytest.fixture
async def engine(fresh_db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(fresh_db_url, pool_size=2, pre_ping=False, generic_plans=True)
    try:
        yield engine
    finally:
        await engine.dispose()


async def _read(connection: AsyncConnection) -> int:
    return int((await connection.exec_driver_sql(_READ)).scalar_one())


async def _backlog_under_quiet_statistics(engine: AsyncEngine) -> list[uuid.UUID]:
    """BACKLOG PENDING jobs under the statistics of the empty table; BATCH of their ids."""
    async with engine.connect() as connection:
        connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        # the statistics of the quiet table, kept while the backlog arrives
        await connection.exec_driver_sql("ALTER TABLE async_jobs SET (autovacuum_enabled = off)")
        await connection.exec_driver_sql("ANALYZE async_jobs")
        user_id = (
            await connection.exec_driver_sql(
                "INSERT INTO users (external_id) VALUES ('claim-plan') RETURNING id"
            )
        ).scalar_one()
        await connection.exec_driver_sql(_BACKLOG, (user_id, BACKLOG))
        found = await connection.exec_driver_sql(
            "SELECT job_id FROM async_jobs ORDER BY random() LIMIT $1", (BATCH,)
        )
        return list(found.scalars())


async def test_a_claim_reads_its_batch_not_the_backlog_under_the_statistics_of_a_quiet_table(
    engine: AsyncEngine,
) -> None:
    job_ids = await _backlog_under_quiet_statistics(engine)

    async with engine.connect() as connection, connection.begin():
        before = await _read(connection)
        claimed = await jobs.claim_batch(connection, job_ids, "w-plan", LEASE)
        read = await _read(connection) - before

    assert set(claimed) == set(job_ids)
    assert all(isinstance(c, jobs.Claimed) and c.job.tries == 1 for c in claimed.values())
    # each job's row by its id a few times over (the claim, the state of those it could not
    # take, the foreign keys of its try and event rows): ~6 a job, not the 20,000 queued
    assert read <= 10 * BATCH, f"the claim read {read} rows and index entries for {BATCH} jobs"


async def test_the_heartbeat_and_the_completion_read_their_batch_not_the_backlog(
    engine: AsyncEngine,
) -> None:
    job_ids = await _backlog_under_quiet_statistics(engine)
    async with engine.connect() as connection:
        connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await jobs.claim_batch(connection, job_ids, "w-plan", LEASE)
    tries = [(job_id, 1) for job_id in job_ids]

    async with engine.connect() as connection, connection.begin():
        before = await _read(connection)
        extended = await jobs.extend_leases(connection, tries, LEASE)
        read_by_heartbeat = await _read(connection) - before
        session = AsyncSession(bind=connection)
        before = await _read(connection)
        completed = await jobs.complete_batch(session, tries)
        read_by_completion = await _read(connection) - before

    assert extended == completed == set(job_ids)
    assert read_by_heartbeat <= 10 * BATCH, read_by_heartbeat
    assert read_by_completion <= 10 * BATCH, read_by_completion
