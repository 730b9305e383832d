"""What the executor makes of a claim that raises, on real PostgreSQL (no broker): a claim
that loses a deadlock is requeued as contention, an error that is neither an outage nor
contention is logged as the bug it is, with its traceback. A fresh worker's claims once
raised AttributeError, were read as a database outage and passed for one for a day.
Catching tests of the mutation `claim-errors-read-as-outages`."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.db.engine import plain_url
from san_common.worker.executor import Outcome
from tests.faults.test_leases import MemoryDelivery, RefineHandler, _executor, _job, _row
from tests.waiting import eventually

# The claim of the job whose scrap is marked waits for advisory lock 13 (the row of its
# job already locked by its UPDATE); the test's own transaction takes that lock first.
WAIT_IN_CLAIM = """
CREATE FUNCTION wait_in_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'PROCESSING' THEN PERFORM pg_advisory_xact_lock(13); END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER wait_in_claim BEFORE UPDATE ON async_jobs
    FOR EACH ROW EXECUTE FUNCTION wait_in_claim();
"""

FAIL_IN_CLAIM = """
CREATE FUNCTION fail_in_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'PROCESSING' THEN RAISE EXCEPTION 'a bug in the claim'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_in_claim BEFORE UPDATE ON async_jobs
    FOR EACH ROW EXECUTE FUNCTION fail_in_claim();
"""


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_claim_that_loses_a_deadlock_is_requeued_as_contention(
    fresh_sessions: async_sessionmaker[AsyncSession],
    fresh_db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="san_common.worker")
    job = await _job(fresh_sessions)
    other = await asyncpg.connect(plain_url(fresh_db_url))
    try:
        await other.execute(WAIT_IN_CLAIM)
        # The claim waits first, so its deadlock check runs first and it is the one rolled
        # back; this transaction's own check comes much later.
        await other.execute("SET deadlock_timeout = '30s'")
        handler = RefineHandler("refined")
        delivery = MemoryDelivery(job.body)
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock(13)")
            handling = asyncio.create_task(
                _executor(fresh_sessions, handler, "w-a").handle(delivery)
            )
            await eventually(
                lambda: _waits_for_advisory_lock(other), what="the claim waiting for the lock"
            )
            # the claim holds the job's row: this UPDATE closes the cycle
            await other.execute(
                "UPDATE async_jobs SET updated_at = now() WHERE job_id = $1", job.job_id
            )
        assert await handling == Outcome.REQUEUED
    finally:
        await other.close()
    assert delivery.settled == ["requeue"] and handler.runs == 0
    row = await _row(fresh_sessions, job.job_id)
    assert (row.status, row.tries) == ("PENDING", 0)
    (line,) = _warnings(caplog)
    assert line.getMessage() == "lost to a concurrent transaction; job requeued"
    assert line.levelno == logging.WARNING and "deadlock" in str(line.__dict__["fields"])


async def _waits_for_advisory_lock(connection: asyncpg.Connection) -> bool:
    return bool(
        await connection.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
    )


async def test_an_error_of_the_claim_that_is_no_outage_is_logged_as_a_bug(
    fresh_sessions: async_sessionmaker[AsyncSession],
    fresh_db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="san_common.worker")
    job = await _job(fresh_sessions)
    other = await asyncpg.connect(plain_url(fresh_db_url))
    try:
        await other.execute(FAIL_IN_CLAIM)
    finally:
        await other.close()
    handler = RefineHandler("refined")
    delivery = MemoryDelivery(job.body)
    assert await _executor(fresh_sessions, handler, "w-a").handle(delivery) == Outcome.REQUEUED
    assert delivery.settled == ["requeue"] and handler.runs == 0
    assert (await _row(fresh_sessions, job.job_id)).status == "PENDING"
    (line,) = _warnings(caplog)
    assert line.levelno == logging.ERROR
    assert line.getMessage() == "unexpected error executing a job; message requeued"
    assert line.exc_info is not None and "a bug in the claim" in str(line.exc_info[1])
