"""Helpers of the admin suite: operator tokens and jobs inserted as a given state."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.auth.tokens import OPERATOR_ROLE, mint
from san_common.models import AsyncJob, User
from tests.conftest import JWT_SECRET

Sessions = async_sessionmaker[AsyncSession]


def operator_headers(name: str | None = None) -> dict[str, str]:
    subject = name or f"op-{uuid.uuid4().hex[:8]}"
    return {"Authorization": f"Bearer {mint(JWT_SECRET, subject, role=OPERATOR_ROLE)}"}


def user_headers(subject: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"}


async def new_user(sessions: Sessions) -> tuple[uuid.UUID, str]:
    """A provisioned user (id, external id) whose jobs the test owns."""
    external = f"user-{uuid.uuid4().hex}"
    async with sessions() as session, session.begin():
        user_id: uuid.UUID = await session.scalar(  # type: ignore[assignment]
            insert(User).values(external_id=external).returning(User.id)
        )
    return user_id, external


async def insert_jobs(
    sessions: Sessions,
    user_id: uuid.UUID,
    count: int = 1,
    *,
    status: str = "FAILED",
    job_type: str = "CARD_ANALYSIS",
    error: str | None = "CARD_ANALYSIS failed: boom",
    created_at: datetime | None = None,
    finished_at: datetime | None = None,
    target_id: uuid.UUID | None = None,
) -> list[uuid.UUID]:
    """`count` jobs in one statement, each on a target of its own unless one is given."""
    finished = status in ("COMPLETED", "FAILED", "CANCELLED")
    rows: list[dict[str, Any]] = [
        {
            "job_id": uuid.uuid4(),
            "job_type": job_type,
            "target_id": target_id or uuid.uuid4(),
            "user_id": user_id,
            "status": status,
            "error_message": error if status == "FAILED" else None,
            **({"created_at": created_at, "updated_at": created_at} if created_at else {}),
            "finished_at": finished_at or (datetime.now(UTC) if finished else None),
        }
        for _ in range(count)
    ]
    async with sessions() as session, session.begin():
        await session.execute(insert(AsyncJob), rows)
    return [r["job_id"] for r in rows]
