"""Per-user rate limits and active-job quotas of the job-creating endpoints (SPEC §6).

`job_limits(bucket, jobs)` gives a route two dependencies, run in this order before the
endpoint: a token bucket per user and endpoint (one statement on a connection of the API's
asyncpg pool, before the request's transaction takes a connection, so a refused burst holds
no connection and provisions nothing), then a cap on the user's PENDING/PROCESSING jobs (in
the request's transaction, under a per-user lock, so concurrent requests cannot all see room
for one more).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import Depends, Request

from san_api.deps import (
    ConnectionDep,
    CurrentUser,
    CurrentUserOnConnection,
    SessionDep,
    SettingsDep,
    SubjectDep,
    pooled_connection,
)
from san_api.errors import RateLimited, TooManyActiveJobs
from san_api.limits import repository
from san_api.settings import ApiSettings


class RateLimit:
    """A token bucket: `RATE_LIMIT_JOBS_PER_MINUTE` refill, `RATE_LIMIT_JOBS_BURST` size."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket

    async def __call__(self, request: Request, subject: SubjectDep, settings: SettingsDep) -> None:
        if not settings.rate_limit_enabled:
            return
        burst, per_second = settings.rate_limit_jobs_burst, settings.rate_limit_jobs_per_minute / 60
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
            f"at most {burst} requests at once and {settings.rate_limit_jobs_per_minute:g} per"
            f" minute to this endpoint; retry in {wait} s",
            headers={"Retry-After": str(wait)},
            retryAfterSeconds=wait,
        )


class JobQuota:
    """At most `ACTIVE_JOBS_MAX_PER_USER` PENDING/PROCESSING jobs per user."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

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
        if not settings.rate_limit_enabled:
            return
        await repository.lock_user_jobs(session, user.user_id)
        self.refuse_beyond_cap(await repository.count_active_jobs(session, user.user_id), settings)


class ActiveJobQuotaOnConnection(JobQuota):
    """`ActiveJobQuota` in the request's transaction on `ConnectionDep`."""

    async def __call__(
        self, user: CurrentUserOnConnection, connection: ConnectionDep, settings: SettingsDep
    ) -> None:
        if not settings.rate_limit_enabled:
            return
        await repository.lock_user_jobs_on(connection, user.user_id)
        active = await repository.count_active_jobs_on(connection, user.user_id)
        self.refuse_beyond_cap(active, settings)


def job_limits(bucket: str, *, jobs: int = 1, on_connection: bool = False) -> list[Any]:
    """The route dependencies of a job-creating endpoint (`jobs`: how many it registers;
    `on_connection`: its transaction is `ConnectionDep`, not `SessionDep`)."""
    quota = ActiveJobQuotaOnConnection(jobs) if on_connection else ActiveJobQuota(jobs)
    return [Depends(RateLimit(bucket)), Depends(quota)]
