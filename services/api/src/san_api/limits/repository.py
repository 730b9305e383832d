"""The token bucket, and a user's active-job count and budget override: in PostgreSQL, so
every API replica shares them."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from decimal import Decimal

import asyncpg

from san_common.usage import ledger
from san_common.usage.ledger import Connection

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


@dataclass(frozen=True)
class Standing:
    """What admits a user's job-creating request: their PENDING/PROCESSING jobs, and their
    budget override (None: the default; docs/operations.md, "Budgets")."""

    active_jobs: int
    tokens_per_day: int | None
    usd_per_month: Decimal | None


async def lock_user_jobs(connection: Connection, user_id: uuid.UUID) -> None:
    """Serialize this user's job-creating requests until the request's transaction ends, so
    a count of active jobs stays true until the new ones are inserted."""
    await ledger.execute(connection, _LOCK_USER_JOBS, str(user_id))


async def standing(connection: Connection, user_id: uuid.UUID) -> Standing:
    """Read after `lock_user_jobs`, in a statement of its own: a statement sees the rows
    committed before it started, so a count in the locking statement could miss the jobs
    of the request that held the lock."""
    row = (await ledger.fetch(connection, _STANDING, user_id))[0]
    return Standing(int(row["active_jobs"]), row["tokens_per_day"], row["usd_per_month"])


_LOCK_USER_JOBS = "SELECT pg_advisory_xact_lock(hashtextextended('san-active-jobs:' || $1, 0))"
# One round trip for both: the budget override is a primary-key probe beside the count.
_STANDING = """
SELECT (SELECT count(*) FROM async_jobs
        WHERE user_id = $1 AND status IN ('PENDING', 'PROCESSING')) AS active_jobs,
    b.tokens_per_day, b.usd_per_month
FROM (SELECT) AS one LEFT JOIN user_budgets AS b ON b.user_id = $1
"""
