"""Queries of the github-worker. Each runs in the caller's (the runtime's) transaction."""

from __future__ import annotations

import uuid
from datetime import date

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import DailySummary, GithubAccount, TilGithubCommit


async def get_commit(session: AsyncSession, commit_id: uuid.UUID) -> TilGithubCommit | None:
    return await session.get(TilGithubCommit, commit_id)


async def get_encrypted_token(session: AsyncSession, user_id: uuid.UUID) -> str | None:
    return await session.scalar(
        select(GithubAccount.encrypted_token).where(GithubAccount.user_id == user_id)
    )


async def summary_date(session: AsyncSession, summary_id: uuid.UUID) -> date | None:
    return await session.scalar(
        select(DailySummary.target_date).where(DailySummary.id == summary_id)
    )


async def complete(
    session: AsyncSession, commit_id: uuid.UUID, commit_sha: str | None, commit_url: str | None
) -> None:
    await session.execute(
        update(TilGithubCommit)
        .where(TilGithubCommit.id == commit_id)
        .values(
            commit_sha=commit_sha,
            commit_url=commit_url,
            error_message=None,
            updated_at=func.now(),
        )
    )
