"""How `make bench` knows a scenario is over (benchmarks/peers/common.py): its cheap poll
reads the last job's row first, and must still wait for every job."""

from __future__ import annotations

import asyncpg
import pytest

from benchmarks.peers.common import BENCH_TABLE_DDL, _insert_rows, _wait_done, _wait_first


async def test_the_last_job_done_first_does_not_end_the_wait(fresh_db_url: str) -> None:
    connection = await asyncpg.connect(fresh_db_url)
    try:
        await connection.execute(BENCH_TABLE_DDL)
        ids = await _insert_rows(connection, 3)
        with pytest.raises(TimeoutError, match="no job done"):
            await _wait_first(connection, ids, timeout=0.1)
        await connection.execute("UPDATE bench_rows SET done_at = now() WHERE id = $1", ids[-1])
        assert await _wait_first(connection, ids, timeout=5) == 1
        with pytest.raises(TimeoutError, match="only 1 of 3 jobs done"):
            await _wait_done(connection, ids, timeout=0.1)
        await connection.execute("UPDATE bench_rows SET done_at = now()")
        await _wait_done(connection, ids, timeout=5)
    finally:
        await connection.close()
