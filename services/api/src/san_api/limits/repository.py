"""The token bucket and the active-job count, in PostgreSQL so every API replica shares them."""

from __future__ import annotations

import uuid

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

# One statement takes a token when the bucket (refilled for the time since its last take,
# capped at the burst) holds one; the row lock of ON CONFLICT makes concurrent takes of one
# bucket queue up, whichever replica runs them. clock_timestamp(), not now(): the time of
# the take, not of the transaction's start. It needs no transaction around it: autocommit,
# one round trip.
_TAKE = """
    INSERT INTO rate_limit_buckets AS b (subject, bucket, tokens, updated_at)
    VALUES ($1, $2, $3::float8 - 1, clock_timestamp())
    ON CONFLICT (subject, bucket) DO UPDATE SET
        tokens = LEAST($3::float8, b.tokens + $4::float8
            * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - b.updated_at))) - 1,
        updated_at = clock_timestamp()
    WHERE LEAST($3::float8, b.tokens + $4::float8
            * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - b.updated_at))) >= 1
    RETURNING tokens
"""
_LEVEL = """
    SELECT LEAST($3::float8, tokens + $4::float8
        * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - updated_at)))
    FROM rate_limit_buckets WHERE subject = $1 AND bucket = $2
"""


async def take_token(
    connection: asyncpg.Connection, subject: str, bucket: str, *, burst: int, per_second: float
) -> float | None:
    """Tokens left after taking one, or None (nothing taken) when the bucket is empty."""
    left = await connection.fetchval(_TAKE, subject, bucket, float(burst), float(per_second))
    return None if left is None else float(left)


async def tokens_now(
    connection: asyncpg.Connection, subject: str, bucket: str, *, burst: int, per_second: float
) -> float:
    level = await connection.fetchval(_LEVEL, subject, bucket, float(burst), float(per_second))
    return float(level or 0.0)


async def lock_user_jobs(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Serialize this user's job-creating requests until the request's transaction ends, so
    a count of active jobs stays true until the new ones are inserted."""
    await (await session.connection()).exec_driver_sql(_LOCK_USER_JOBS, (str(user_id),))


async def count_active_jobs(session: AsyncSession, user_id: uuid.UUID) -> int:
    found = await (await session.connection()).exec_driver_sql(_COUNT_ACTIVE, (user_id,))
    return int(found.scalar() or 0)


async def lock_user_jobs_on(connection: asyncpg.Connection, user_id: uuid.UUID) -> None:
    """`lock_user_jobs` in a transaction on an asyncpg connection."""
    await connection.execute(_LOCK_USER_JOBS, str(user_id))


async def count_active_jobs_on(connection: asyncpg.Connection, user_id: uuid.UUID) -> int:
    return int(await connection.fetchval(_COUNT_ACTIVE, user_id) or 0)


_LOCK_USER_JOBS = "SELECT pg_advisory_xact_lock(hashtextextended('san-active-jobs:' || $1, 0))"
_COUNT_ACTIVE = (
    "SELECT count(*) FROM async_jobs WHERE user_id = $1 AND status IN ('PENDING', 'PROCESSING')"
)
