"""`register_job` (a transaction of its own) runs its one statement on the pooled
connection's asyncpg driver, past SQLAlchemy: a connection that dies under it must not go
back into the pool for the next registration to fail on."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from san_common.db.engine import create_engine, create_session_factory
from san_common.errors import is_connection_loss
from san_common.jobs.registration import DuplicateActiveJob, register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, OutboxMessage
from tests.faults.harness import killing_trigger, run_sql

KILL_FIRST_REGISTRATION = (
    killing_trigger("kill_register", 1)
    + """
CREATE TRIGGER kill_register BEFORE INSERT ON async_jobs
    FOR EACH ROW EXECUTE FUNCTION kill_register();
"""
)


async def test_a_connection_lost_mid_registration_is_not_pooled_again(fresh_db_url: str) -> None:
    await run_sql(fresh_db_url, KILL_FIRST_REGISTRATION)
    # one pooled connection and no pre-ping: the next registration gets whatever came back
    engine = create_engine(fresh_db_url, pool_size=1, pre_ping=False)
    sessions = create_session_factory(engine)
    user = uuid.uuid4()
    try:
        with pytest.raises(Exception) as lost:
            await register_job(
                sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=user
            )
        assert is_connection_loss(lost.value), repr(lost.value)
        # the backend is gone: had its connection gone back to the pool, this would fail
        again = await register_job(
            sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=user
        )
        async with sessions() as session:
            jobs = (await session.scalars(select(AsyncJob.job_id))).all()
            messages = await session.scalar(select(func.count()).select_from(OutboxMessage))
    finally:
        await engine.dispose()
    # nothing of the lost registration was written, the second one whole
    assert jobs == [again.job_id]
    assert messages == 1


async def test_a_refused_registration_leaves_its_connection_clean(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url, pool_size=1, pre_ping=False)
    sessions = create_session_factory(engine)
    target, user = uuid.uuid4(), uuid.uuid4()
    try:
        await register_job(sessions, job_type=JobType.SCRAP_REFINE, target_id=target, user_id=user)
        with pytest.raises(DuplicateActiveJob):
            await register_job(
                sessions, job_type=JobType.SCRAP_REFINE, target_id=target, user_id=user
            )
        # the same pooled connection again: left inside a transaction, this one would never
        # be committed and another connection would not see it
        await register_job(
            sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=user
        )
        assert await run_sql(fresh_db_url, "SELECT count(*) FROM outbox_messages") == 2
    finally:
        await engine.dispose()
