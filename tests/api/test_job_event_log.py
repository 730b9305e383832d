"""The job-event log under the statements the runtime really makes (migration 0009): a
batch claim or completion changes a dozen jobs in one UPDATE, and each job still gets its
one event and its one NOTIFY; an UPDATE that changes no status (a heartbeat) and an insert
skipped by the active-job index log nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from san_common.db.engine import plain_url
from tests.waiting import eventually


@pytest.fixture
async def connection(fresh_db_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(plain_url(fresh_db_url))
    yield connection
    await connection.close()


async def _insert(connection: asyncpg.Connection, targets: list[uuid.UUID]) -> list[uuid.UUID]:
    """Jobs for `targets` in one multi-row INSERT, skipping a target with an active job."""
    rows = await connection.fetch(
        "INSERT INTO async_jobs (job_id, job_type, target_id, user_id) "
        "SELECT gen_random_uuid(), 'SCRAP_REFINE', t, $2 FROM unnest($1::uuid[]) t "
        "ON CONFLICT (target_id, job_type) WHERE status IN ('PENDING', 'PROCESSING') "
        "DO NOTHING RETURNING job_id",
        targets,
        uuid.uuid4(),
    )
    return [r["job_id"] for r in rows]


async def _log(connection: asyncpg.Connection) -> list[tuple[uuid.UUID, str, int]]:
    rows = await connection.fetch("SELECT job_id, status, id FROM async_job_events ORDER BY id")
    return [(r["job_id"], r["status"], r["id"]) for r in rows]


async def test_each_row_a_statement_changes_gets_its_event_and_its_notify(
    fresh_db_url: str, connection: asyncpg.Connection
) -> None:
    heard: list[str] = []
    listener = await asyncpg.connect(plain_url(fresh_db_url))
    await listener.add_listener("san_job_events", lambda *args: heard.append(args[3]))
    try:
        jobs = await _insert(connection, [uuid.uuid4() for _ in range(12)])
        # a claim of the batch, as the worker's: one UPDATE, every status changed
        await connection.execute(
            "UPDATE async_jobs SET status = 'PROCESSING', tries = tries + 1 WHERE job_id = ANY($1)",
            jobs,
        )
        # a heartbeat: no status changes, nothing logged
        await connection.execute(
            "UPDATE async_jobs SET lease_expires_at = now() WHERE job_id = ANY($1)", jobs
        )
        # half complete together; an UPDATE that sets the same status logs nothing either
        await connection.execute(
            "UPDATE async_jobs SET status = CASE WHEN job_id = ANY($2) THEN 'COMPLETED' "
            "ELSE status END WHERE job_id = ANY($1)",
            jobs,
            jobs[:6],
        )
        # a second job for an active target is skipped, and logs nothing
        taken = await connection.fetchval(
            "SELECT target_id FROM async_jobs WHERE job_id = $1", jobs[-1]
        )
        assert await _insert(connection, [taken]) == []
        log = await _log(connection)

        async def all_heard() -> bool:  # each event's NOTIFY, delivered at its commit
            return len(heard) >= len(log)

        await eventually(all_heard, within=10, what="a NOTIFY per event")
    finally:
        await listener.close()
    statuses: dict[uuid.UUID, list[str]] = {}
    for job_id, status, _ in log:
        statuses.setdefault(job_id, []).append(status)
    assert statuses == {
        job: ["PENDING", "PROCESSING", *(["COMPLETED"] if job in jobs[:6] else [])] for job in jobs
    }
    assert sorted(heard) == sorted(f"{job_id}:{event_id}" for job_id, _, event_id in log)
