"""Request-state cleanup: the API's per-request rows do not grow forever. Rate-limit buckets
untouched for `BUCKET_IDLE` go (one that old has refilled under any setting the API allows a
user to notice, and a full bucket and no row are the same to the API), and OAuth states
used or expired (they can never be accepted again). A bounded batch per transaction."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_recovery import repository

log = logging.getLogger(__name__)

BATCH = 1000
BUCKET_IDLE = timedelta(days=1)


async def clean(sessions: async_sessionmaker[AsyncSession]) -> tuple[int, int]:
    """Delete idle buckets and spent OAuth states; how many of each were deleted."""
    buckets = states = 0
    while True:
        now = datetime.now(UTC)
        async with sessions() as session, session.begin():
            pruned_buckets = await repository.prune_idle_buckets(
                session, idle_before=now - BUCKET_IDLE, limit=BATCH
            )
            pruned_states = await repository.prune_spent_oauth_states(session, now=now, limit=BATCH)
        buckets, states = buckets + pruned_buckets, states + pruned_states
        if pruned_buckets < BATCH and pruned_states < BATCH:
            break
    if buckets or states:
        log.info(
            "request state cleaned",
            extra={"fields": {"rate_limit_buckets": buckets, "oauth_states": states}},
        )
    return buckets, states
