"""The github-worker's per-user lock also holds across worker processes (two engines stand
in for two processes: the PostgreSQL advisory lock is what they share)."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text

from san_common.db.engine import create_engine
from san_github_worker.locks import UserLocks
from san_github_worker.settings import GithubWorkerSettings
from tests.waiting import eventually

ADVISORY = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def test_a_second_process_waits_for_the_same_user_but_not_for_another(db_url: str) -> None:
    first_engine, second_engine = (
        create_engine(db_url, pool_size=2),
        create_engine(db_url, pool_size=2),
    )
    first, second = UserLocks(first_engine), UserLocks(second_engine)
    alice, bob = uuid.uuid4(), uuid.uuid4()

    async def take(locks: UserLocks, user: uuid.UUID) -> None:
        async with locks.hold(user):
            pass

    async def waiting_on_advisory_lock() -> bool:
        async with first_engine.connect() as connection:
            waiting = await connection.scalar(text(f"{ADVISORY} AND NOT granted"))
        return bool(waiting)

    try:
        async with first.hold(alice):
            await asyncio.wait_for(take(second, bob), 5)  # another user: no wait
            blocked = asyncio.create_task(take(second, alice))
            await eventually(
                waiting_on_advisory_lock,
                within=5,
                what="the second to wait on the advisory lock",
                interval=0.02,
            )
            assert not blocked.done()
        await asyncio.wait_for(blocked, 5)  # released: the second one gets it
        # and nothing stays locked on the pooled connections
        async with first_engine.connect() as connection:
            held = await connection.scalar(text(ADVISORY))
        assert held == 0
    finally:
        await first_engine.dispose()
        await second_engine.dispose()


async def test_a_wait_longer_than_the_engines_statement_timeout_is_no_outage(
    db_url: str,
) -> None:
    """The worker's engine bounds every statement (WORKER_DATABASE_TIMEOUT_SECONDS); waiting
    for the same user's other job is no silent server and must outlast it."""
    holder_engine = create_engine(db_url, pool_size=2)
    settings = GithubWorkerSettings(database_url=db_url, worker_database_timeout_seconds=0.3)
    waiter_engine = settings.database_engine(pool_size=2)
    holder, waiter = UserLocks(holder_engine), UserLocks(waiter_engine)
    alice = uuid.uuid4()

    async def take() -> None:
        async with waiter.hold(alice):
            pass

    try:
        async with holder.hold(alice):
            blocked = asyncio.create_task(take())
            await asyncio.sleep(1.0)  # more than three of the waiter's statement timeouts
            assert not blocked.done(), blocked
        await asyncio.wait_for(blocked, 5)
    finally:
        await holder_engine.dispose()
        await waiter_engine.dispose()
