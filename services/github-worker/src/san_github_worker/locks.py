"""One GitHub mutation at a time per user (GitHub asks integrators not to send concurrent
mutating requests for one token, and a check-then-write must not interleave with another).

Within a process an asyncio lock per user queues the jobs; across worker processes a
PostgreSQL session-level advisory lock does, held on a connection in autocommit mode so no
transaction stays open during the GitHub calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
import weakref
from collections.abc import AsyncIterator

from sqlalchemy.ext.asyncio import AsyncEngine

_KEY = "hashtextextended('san-github-user:' || $1, 0)"
_LOCK = f"SELECT pg_advisory_lock({_KEY})"
_UNLOCK = f"SELECT pg_advisory_unlock({_KEY})"
# The wait for the user's other job is not the server going silent: the job's own timeout
# (the run's) bounds it, not the engine's per-statement one, which would turn a long wait
# into a failed try.
_LOCK_WAIT_SECONDS = 24 * 3600.0


class UserLocks:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._local: weakref.WeakValueDictionary[uuid.UUID, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    @contextlib.asynccontextmanager
    async def hold(self, user_id: uuid.UUID) -> AsyncIterator[None]:
        local = self._local.get(user_id)
        if local is None:
            local = self._local[user_id] = asyncio.Lock()
        async with local, self._engine.connect() as connection:
            await connection.execution_options(isolation_level="AUTOCOMMIT")
            driver = (await connection.get_raw_connection()).driver_connection
            assert driver is not None, "a checked-out connection has its driver's"
            await driver.execute(_LOCK, str(user_id), timeout=_LOCK_WAIT_SECONDS)
            try:
                yield
            finally:
                try:
                    await driver.execute(_UNLOCK, str(user_id))
                except BaseException:
                    # A pooled connection must never carry the lock to its next user.
                    await connection.invalidate()
                    raise
