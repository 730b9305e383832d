"""Per-user rate limits and active-job quotas of the job-creating endpoints
(docs/reference/job-rules.md §6).

`job_limits(bucket, jobs)` gives a route two dependencies, run in this order before the
endpoint: a token bucket per user and endpoint (one statement on a connection of the API's
asyncpg pool, before the request's transaction takes a connection, so a refused burst holds
no connection and provisions nothing), then a cap on the user's PENDING/PROCESSING jobs (in
the request's transaction, under a per-user lock, so concurrent requests cannot all see room
for one more).

`LimitedTransaction(bucket, jobs).open(request, subject)` is the same for an endpoint that
opens its transaction itself on the asyncpg pool (`POST /scraps`): it runs the limit, the
transaction, the user and the cap in that order.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from fastapi import Depends, Request

from san_api.deps import (
    CurrentUser,
    Principal,
    SessionDep,
    SettingsDep,
    SubjectDep,
    pooled_connection,
    transaction_on_connection,
    user_on_connection,
)
from san_api.errors import BudgetExceeded, RateLimited, TooManyActiveJobs
from san_api.limits import repository
from san_api.settings import ApiSettings
from san_common.broker.direct import DirectPublisher
from san_common.jobs.publishing import DirectRows
from san_common.usage import budgets, ledger


@dataclass(frozen=True)
class BucketSize:
    burst: int
    per_minute: float


def jobs_bucket(settings: ApiSettings) -> BucketSize:
    return BucketSize(settings.rate_limit_jobs_burst, settings.rate_limit_jobs_per_minute)


def github_bucket(settings: ApiSettings) -> BucketSize:
    return BucketSize(settings.rate_limit_github_burst, settings.rate_limit_github_per_minute)


class RateLimit:
    """A token bucket per user and `bucket`, sized by `size`: by default the job-creating
    endpoints' (`RATE_LIMIT_JOBS_BURST`, `RATE_LIMIT_JOBS_PER_MINUTE`)."""

    def __init__(
        self, bucket: str, size: Callable[[ApiSettings], BucketSize] = jobs_bucket
    ) -> None:
        self.bucket, self.size = bucket, size

    async def __call__(self, request: Request, subject: SubjectDep, settings: SettingsDep) -> None:
        if not settings.rate_limit_enabled:
            return
        size = self.size(settings)
        burst, per_second = size.burst, size.per_minute / 60
        async with pooled_connection(request) as connection:
            left = await repository.take_token(
                connection, subject, self.bucket, burst=burst, per_second=per_second
            )
            if left is not None:
                return
            level = await repository.tokens_now(
                connection, subject, self.bucket, burst=burst, per_second=per_second
            )
        wait = max(1, math.ceil((1 - level) / per_second)) if per_second > 0 else 3600
        raise RateLimited(
            f"at most {burst} requests at once and {size.per_minute:g} per"
            f" minute to this endpoint; retry in {wait} s",
            headers={"Retry-After": str(wait)},
            retryAfterSeconds=wait,
        )


class JobQuota:
    """At most `ACTIVE_JOBS_MAX_PER_USER` PENDING/PROCESSING jobs per user; and, for a
    request that adds AI jobs (`ai_jobs`, their types), an AI budget not yet spent."""

    def __init__(self, jobs: int, ai_jobs: Sequence[str] = ()) -> None:
        self.jobs = jobs
        self.ai_jobs = [str(t) for t in ai_jobs]

    async def admit(
        self, connection: ledger.Connection, user_id: uuid.UUID, settings: ApiSettings
    ) -> None:
        """In the request's transaction: 429 TOO_MANY_ACTIVE_JOBS when the request would take
        the user past the cap (under the user's lock, held until the transaction ends, so
        concurrent requests cannot all see room for one more), 429 BUDGET_EXCEEDED when it
        would take them past their AI budget. Nothing is registered then."""
        defaults = settings.default_budget()
        if settings.rate_limit_enabled:
            await repository.lock_user_jobs(connection, user_id)
            found = await repository.standing(connection, user_id)
            self.refuse_beyond_cap(found.active_jobs, settings)
            limits = defaults.overridden(found.tokens_per_day, found.usd_per_month)
        elif self.ai_jobs:
            limits = await budgets.limits_for(connection, user_id, defaults)
        else:
            return
        await self.refuse_over_budget(connection, user_id, limits)

    async def refuse_over_budget(
        self, connection: ledger.Connection, user_id: uuid.UUID, limits: budgets.Limits
    ) -> None:
        """429 BUDGET_EXCEEDED when what the user spent, plus what such jobs cost them on
        average, passes a limit (docs/operations.md, "Budgets")."""
        if not self.ai_jobs:
            return
        now = datetime.now(UTC)
        exceeded = await budgets.check_limits(connection, user_id, limits, self.ai_jobs, now=now)
        if exceeded is None:
            return
        wait = exceeded.seconds_to_reset(now)
        raise BudgetExceeded(
            f"{exceeded.message}; it resets at {exceeded.resets_at.isoformat()}",
            headers={"Retry-After": str(wait)},
            retryAfterSeconds=wait,
            resetsAt=exceeded.resets_at.isoformat(),
        )

    def refuse_beyond_cap(self, active: int, settings: ApiSettings) -> None:
        cap = settings.active_jobs_max_per_user
        if active + self.jobs > cap:
            wait = settings.active_jobs_retry_after_seconds
            raise TooManyActiveJobs(
                f"{active} of your jobs are pending or running; the limit is {cap}"
                f" and this request adds {self.jobs}",
                headers={"Retry-After": str(wait)},
                retryAfterSeconds=wait,
                activeJobs=active,
                limit=cap,
            )


class ActiveJobQuota(JobQuota):
    async def __call__(self, user: CurrentUser, session: SessionDep, settings: SettingsDep) -> None:
        await self.admit(session, user.user_id, settings)


def upstream_limit(bucket: str) -> list[Any]:
    """The route dependency of an endpoint that calls GitHub or stores state per request:
    `RATE_LIMIT_GITHUB_BURST` at once, `RATE_LIMIT_GITHUB_PER_MINUTE` refill, per user."""
    return [Depends(RateLimit(bucket, github_bucket))]


def job_limits(bucket: str, *, jobs: int = 1, ai_jobs: Sequence[str] = ()) -> list[Any]:
    """The route dependencies of a job-creating endpoint (`jobs`: how many it registers;
    `ai_jobs`: the types of the AI jobs among them, checked against the user's budget)."""
    return [Depends(RateLimit(bucket)), Depends(ActiveJobQuota(jobs, ai_jobs))]


@dataclass(frozen=True)
class JobRequest:
    """A job-creating request's open transaction on the asyncpg pool, and its user; and
    the rows it registers for direct publish (None: the relay publishes every one), which
    are published once the transaction has committed."""

    connection: asyncpg.Connection
    user: Principal
    direct: DirectRows | None = None


class LimitedTransaction(JobQuota):
    """`job_limits` and the request's transaction on a connection of the asyncpg pool, with
    its user, for an endpoint that opens them itself (`async with limits.open(request,
    subject) as job:`), in the order they must run: the rate limit (before a connection is
    taken), the transaction, the user, the cap (in the transaction, under the user's lock).
    The endpoint owns the transaction, so the hottest path of the API (`POST /scraps`) pays
    for none of FastAPI's dependency machinery beyond the token (docs/hot-paths.md). The
    transaction commits when the block ends, so the endpoint answers for committed rows only.
    """

    def __init__(self, bucket: str, jobs: int, ai_jobs: Sequence[str] = ()) -> None:
        super().__init__(jobs, ai_jobs)
        self.rate_limit = RateLimit(bucket)

    @asynccontextmanager
    async def open(self, request: Request, subject: str) -> AsyncIterator[JobRequest]:
        settings: ApiSettings = request.app.state.settings
        await self.rate_limit(request, subject, settings)
        publisher: DirectPublisher | None = request.app.state.publisher
        direct = publisher.batch() if publisher is not None else None
        async with transaction_on_connection(request) as connection:
            user = await user_on_connection(request, connection, subject)
            await self.admit(connection, user.user_id, settings)
            yield JobRequest(connection, user, direct)
        # committed (a block that failed rolled back and raised out of it)
        if publisher is not None and direct is not None:
            publisher.submit(direct.rows)
