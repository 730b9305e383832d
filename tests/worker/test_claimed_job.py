"""The job a claim hands to its handler (`jobs.lifecycle._job`, built without the ORM's
constructor) is the row as the ORM loads it: every column, the checkpoint parsed, and
no session of its own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from datetime import timedelta

from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.db.engine import plain_url
from san_common.jobs import lifecycle as jobs
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob


async def test_the_claimed_job_holds_every_column_of_its_row(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    registered = await register_job(
        sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=uuid.uuid4()
    )
    async with sessions() as session, session.begin():
        job = await session.get_one(AsyncJob, registered.job_id)
        job.checkpoint = {"done": [1, 2], "note": "kept across tries"}
    async with sessions() as session, session.begin():
        connection = await session.connection()
        found = await jobs.claim_batch(
            connection, [registered.job_id], "w-columns", timedelta(seconds=30)
        )
    claimed = found[registered.job_id]
    assert isinstance(claimed, jobs.Claimed)
    async with sessions() as session:
        row = await session.get_one(AsyncJob, registered.job_id)
    columns = [c.key for c in AsyncJob.__table__.columns]
    assert {c: getattr(claimed.job, c) for c in columns} == {c: getattr(row, c) for c in columns}
    assert claimed.job.checkpoint == {"done": [1, 2], "note": "kept across tries"}
    assert (claimed.job.status, claimed.job.tries, claimed.job.worker_id) == (
        "PROCESSING",
        1,
        "w-columns",
    )
    assert inspect(claimed.job).transient


# A worker process's first claim, before anything in it touched the ORM: the job is built
# without the constructor, which is what configures the mappers on first use.
_FIRST_CLAIM = """
import asyncio, sys, uuid
from datetime import timedelta
from san_common.db.engine import create_engine
from san_common.jobs import lifecycle as jobs

async def main():
    engine = create_engine(sys.argv[1], pool_size=1)
    async with engine.connect() as connection:
        found = await jobs.claim_batch(
            connection, [uuid.UUID(sys.argv[2])], "w-fresh", timedelta(seconds=30)
        )
        await connection.commit()
    await engine.dispose()
    job = found[uuid.UUID(sys.argv[2])].job
    print(job.job_id, job.status, job.tries)

asyncio.run(main())
"""


async def test_a_fresh_process_reads_the_job_of_its_first_claim(
    sessions: async_sessionmaker[AsyncSession], db_url: str
) -> None:
    registered = await register_job(
        sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=uuid.uuid4()
    )
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _FIRST_CLAIM, plain_url(db_url), str(registered.job_id)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(registered.job_id), "PROCESSING", "1"]
