"""The scrap queries of `POST /scraps`, as named SQL on the request's asyncpg connection
(the API's hot write path: docs/hot-paths.md)."""

from __future__ import annotations

import uuid

import asyncpg


async def insert_if_absent(
    connection: asyncpg.Connection, user_id: uuid.UUID, content: str, content_hash: str
) -> uuid.UUID | None:
    """Insert the scrap unless the user already has this content; None if they do.

    Concurrent identical inserts serialize on the unique index: the loser waits for the
    winner's commit and then sees the conflict.
    """
    scrap_id: uuid.UUID | None = await connection.fetchval(
        _INSERT_IF_ABSENT, user_id, content, content_hash
    )
    return scrap_id


async def find_by_hash(
    connection: asyncpg.Connection, user_id: uuid.UUID, content_hash: str
) -> uuid.UUID | None:
    scrap_id: uuid.UUID | None = await connection.fetchval(_FIND_BY_HASH, user_id, content_hash)
    return scrap_id


async def has_card(connection: asyncpg.Connection, scrap_id: uuid.UUID) -> bool:
    return bool(await connection.fetchval(_HAS_CARD, scrap_id))


async def active_job(
    connection: asyncpg.Connection, scrap_id: uuid.UUID, job_type: str
) -> uuid.UUID | None:
    """The scrap's PENDING or PROCESSING job of `job_type`, if it has one."""
    job_id: uuid.UUID | None = await connection.fetchval(_ACTIVE_JOB, scrap_id, job_type)
    return job_id


_INSERT_IF_ABSENT = """
INSERT INTO scraps (user_id, content, content_hash) VALUES ($1, $2, $3)
ON CONFLICT (user_id, content_hash) DO NOTHING
RETURNING id
"""
_FIND_BY_HASH = "SELECT id FROM scraps WHERE user_id = $1 AND content_hash = $2"
_HAS_CARD = "SELECT EXISTS (SELECT 1 FROM knowledge_cards WHERE scrap_id = $1)"
_ACTIVE_JOB = """
SELECT job_id FROM async_jobs
WHERE target_id = $1 AND job_type = $2 AND status IN ('PENDING', 'PROCESSING')
"""
