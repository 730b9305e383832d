"""The github-worker's per-user lock also holds across worker processes (two engines stand
in for two processes: the PostgreSQL advisory lock is what they share)."""

from __future__ import annotations

import asyncio
import uuid

from sqlalchemy import text

from san_common.db.engine import create_engine
from san_github_worker.locks import UserLocks
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
