"""The ledger's queries: named SQL with positional parameters, run on the caller's
SQLAlchemy connection or on an asyncpg connection (`POST /scraps` runs on one)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeAlias

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from san_common.usage import TryUsage

Connection: TypeAlias = AsyncSession | AsyncConnection | asyncpg.Connection

# A try's calls are written in one statement, once: a try the ledger already has is
# skipped, so writing them again after a commit whose answer was lost (a worker holding a
# result through an outage retries it) counts nothing twice.
_INSERT = """
INSERT INTO ai_usage (job_id, try_no, user_id, job_type, model, call, prompt_tokens,
    completion_tokens, embedding_tokens, estimated, latency_ms, cost_usd)
SELECT * FROM unnest($1::uuid[], $2::integer[], $3::uuid[], $4::text[], $5::text[],
    $6::text[], $7::integer[], $8::integer[], $9::integer[], $10::boolean[], $11::integer[],
    $12::numeric[]) AS u (job_id, try_no)
WHERE NOT EXISTS (
    SELECT FROM ai_usage AS a WHERE a.job_id = u.job_id AND a.try_no = u.try_no
)
"""

_OF_JOB = """
SELECT coalesce(sum(prompt_tokens), 0) AS prompt, coalesce(sum(completion_tokens), 0)
    AS completion, coalesce(sum(embedding_tokens), 0) AS embedding,
    coalesce(sum(cost_usd), 0) AS cost
FROM ai_usage WHERE job_id = $1
"""

# $1 user, $2 from, $3 to (exclusive): per UTC day and job type
_PER_DAY = """
SELECT (at AT TIME ZONE 'UTC')::date AS day, job_type,
    sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion,
    sum(embedding_tokens) AS embedding, sum(cost_usd) AS cost, count(DISTINCT job_id) AS jobs
FROM ai_usage
WHERE user_id = $1 AND at >= $2 AND at < $3
GROUP BY 1, 2 ORDER BY 1, 2
"""

# $1 since: everyone's spending per UTC day, per job type and per user, in one pass
# (a row of one grouping has the other two columns null; none is null in the table).
_SPENDING = """
SELECT (u.at AT TIME ZONE 'UTC')::date AS day, u.job_type, u.user_id,
    min(users.external_id) AS external_id,
    sum(u.prompt_tokens + u.completion_tokens + u.embedding_tokens) AS tokens,
    sum(u.cost_usd) AS cost, count(DISTINCT u.job_id) AS jobs
FROM ai_usage AS u LEFT JOIN users ON users.id = u.user_id
WHERE u.at >= $1
GROUP BY GROUPING SETS (((u.at AT TIME ZONE 'UTC')::date), (u.job_type), (u.user_id))
ORDER BY 1, sum(u.cost_usd) DESC, 2, 3
"""

# $1 user, $2 start of the day, $3 start of the month, $4 the job types a request adds:
# what the user spent, and what a job of each of those types cost them on average lately
# (the month's jobs; none yet: nothing expected).
_SPENT = """
WITH month AS (
    SELECT job_id, job_type, at, prompt_tokens + completion_tokens + embedding_tokens AS tokens,
        cost_usd
    FROM ai_usage WHERE user_id = $1::uuid AND at >= least($2::timestamptz, $3::timestamptz)
), per_job AS (
    SELECT job_type, sum(tokens) AS tokens, sum(cost_usd) AS cost
    FROM month WHERE job_type = ANY($4::text[]) GROUP BY job_id, job_type
)
SELECT
    (SELECT coalesce(sum(tokens), 0) FROM month WHERE at >= $2::timestamptz) AS tokens_today,
    (SELECT coalesce(sum(cost_usd), 0) FROM month WHERE at >= $3::timestamptz) AS usd_month,
    (SELECT coalesce(sum(avg_tokens), 0) FROM (
        SELECT avg(tokens) AS avg_tokens FROM per_job GROUP BY job_type) AS a) AS tokens_expected,
    (SELECT coalesce(sum(avg_cost), 0) FROM (
        SELECT avg(cost) AS avg_cost FROM per_job GROUP BY job_type) AS c) AS usd_expected
"""


@dataclass(frozen=True)
class Totals:
    prompt_tokens: int
    completion_tokens: int
    embedding_tokens: int
    cost_usd: Decimal


@dataclass(frozen=True)
class DayTotals:
    day: Any  # datetime.date
    job_type: str
    jobs: int
    totals: Totals


@dataclass(frozen=True)
class Spending:
    """What everyone spent in one group: a UTC day, a job type or a user."""

    key: Any  # datetime.date, a job type or a user id
    external_id: str | None  # the user's, for a user group
    tokens: int
    cost_usd: Decimal
    jobs: int


@dataclass(frozen=True)
class SpendingReport:
    per_day: list[Spending]
    per_job_type: list[Spending]
    per_user: list[Spending]


@dataclass(frozen=True)
class Spent:
    tokens_today: int
    usd_month: Decimal
    # What the jobs a request adds are expected to cost (the user's recent average).
    tokens_expected: int
    usd_expected: Decimal


async def fetch(connection: Connection, statement: str, *params: object) -> list[Mapping[str, Any]]:
    """The rows of `statement` (positional parameters `$1`…) on either kind of connection."""
    if isinstance(connection, asyncpg.Connection):
        return list(await connection.fetch(statement, *params))
    if isinstance(connection, AsyncSession):
        connection = await connection.connection()
    return list((await connection.exec_driver_sql(statement, params)).mappings().all())


async def execute(connection: Connection, statement: str, *params: object) -> None:
    """`statement`, which returns no rows, on either kind of connection."""
    if isinstance(connection, asyncpg.Connection):
        await connection.execute(statement, *params)
        return
    if isinstance(connection, AsyncSession):
        connection = await connection.connection()
    await connection.exec_driver_sql(statement, params)


async def insert(connection: Connection, tries: Sequence[TryUsage]) -> int:
    """The calls of `tries`, one row each, in one statement, but for a try the ledger has
    already (`_INSERT`); returns how many calls it was given."""
    rows = [(t, c) for t in tries for c in t.calls]
    if not rows:
        return 0
    columns: list[list[object]] = [
        [t.job_id for t, _ in rows],
        [t.try_no for t, _ in rows],
        [t.user_id for t, _ in rows],
        [t.job_type for t, _ in rows],
        [c.model for _, c in rows],
        [c.call for _, c in rows],
        [c.prompt_tokens for _, c in rows],
        [c.completion_tokens for _, c in rows],
        [c.embedding_tokens for _, c in rows],
        [c.estimated for _, c in rows],
        [c.latency_ms for _, c in rows],
        [c.cost_usd for _, c in rows],
    ]
    await execute(connection, _INSERT, *columns)
    return len(rows)


async def of_job(connection: Connection, job_id: uuid.UUID) -> Totals:
    [row] = await fetch(connection, _OF_JOB, job_id)
    return Totals(int(row["prompt"]), int(row["completion"]), int(row["embedding"]), row["cost"])


async def per_day(
    connection: Connection, user_id: uuid.UUID, start: datetime, end: datetime
) -> list[DayTotals]:
    rows = await fetch(connection, _PER_DAY, user_id, start, end)
    return [
        DayTotals(
            r["day"],
            r["job_type"],
            int(r["jobs"]),
            Totals(int(r["prompt"]), int(r["completion"]), int(r["embedding"]), r["cost"]),
        )
        for r in rows
    ]


async def spent(
    connection: Connection,
    user_id: uuid.UUID,
    *,
    day_start: datetime,
    month_start: datetime,
    job_types: Sequence[str],
) -> Spent:
    [row] = await fetch(connection, _SPENT, user_id, day_start, month_start, list(job_types))
    return Spent(
        int(row["tokens_today"]),
        row["usd_month"],
        round(row["tokens_expected"]),
        row["usd_expected"],
    )


async def spending(connection: Connection, since: datetime) -> SpendingReport:
    """Everyone's spending since `since`, per UTC day (oldest first), per job type and per
    user (most expensive first)."""
    report = SpendingReport([], [], [])
    for r in await fetch(connection, _SPENDING, since):
        if r["day"] is not None:
            group, key = report.per_day, r["day"]
        elif r["job_type"] is not None:
            group, key = report.per_job_type, r["job_type"]
        else:
            group, key = report.per_user, r["user_id"]
        external = r["external_id"] if group is report.per_user else None
        group.append(Spending(key, external, int(r["tokens"]), r["cost"], int(r["jobs"])))
    return report
