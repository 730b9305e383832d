"""Outbox cleanup: published rows are deleted once `OUTBOX_RETENTION_HOURS` old, a bounded
batch per transaction. Unpublished rows are never touched (retention deletes those of
pruned jobs with the jobs)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import metrics
from san_recovery import repository

log = logging.getLogger(__name__)

BATCH = 1000


async def clean(sessions: async_sessionmaker[AsyncSession], retention: timedelta) -> int:
    """Delete the published rows older than `retention`; how many were deleted."""
    deleted = 0
    started = time.monotonic()
    while True:
        async with sessions() as session, session.begin():
            count = await repository.delete_published_before(session, retention, BATCH)
        deleted += count
        if count < BATCH:
            break
    metrics.OUTBOX_CLEANED.inc(deleted)
    if deleted:
        log.info(
            "outbox cleaned",
            extra={"fields": {"deleted": deleted, "ms": int((time.monotonic() - started) * 1000)}},
        )
    return deleted
