"""The token bucket and the active-job count, in PostgreSQL so every API replica shares them."""

from __future__ import annotations

import uuid

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

# One statement takes a token when the bucket (refilled for the time since its last take,
# capped at the burst) holds one; the row lock of ON CONFLICT makes concurrent takes of one
# bucket queue up, whichever replica runs them. clock_timestamp(), not now(): the time of
# the take, not of the transaction's start.
_TAKE = text(
    """
    INSERT INTO rate_limit_buckets AS b (subject, bucket, tokens, updated_at)
    VALUES (:subject, :bucket, CAST(:burst AS float8) - 1, clock_timestamp())
    ON CONFLICT (subject, bucket) DO UPDATE SET
        tokens = LEAST(CAST(:burst AS float8), b.tokens + CAST(:per_second AS float8)
            * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - b.updated_at))) - 1,
        updated_at = clock_timestamp()
    WHERE LEAST(CAST(:burst AS float8), b.tokens + CAST(:per_second AS float8)
            * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - b.updated_at))) >= 1
    RETURNING tokens
    """
)
_LEVEL = text(
    """
    SELECT LEAST(CAST(:burst AS float8), tokens + CAST(:per_second AS float8)
        * GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - updated_at)))
    FROM rate_limit_buckets WHERE subject = :subject AND bucket = :bucket
    """
)


async def take_token(
    connection: AsyncConnection, subject: str, bucket: str, *, burst: int, per_second: float
) -> float | None:
    """Tokens left after taking one, or None (nothing taken) when the bucket is empty."""
    params = {"subject": subject, "bucket": bucket, "burst": burst, "per_second": per_second}
    left = (await connection.execute(_TAKE, params)).scalar()
    return None if left is None else float(left)


async def tokens_now(
    connection: AsyncConnection, subject: str, bucket: str, *, burst: int, per_second: float
) -> float:
    params = {"subject": subject, "bucket": bucket, "burst": burst, "per_second": per_second}
    return float((await connection.execute(_LEVEL, params)).scalar() or 0.0)


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
