"""Queries of the GitHub endpoints. They only flush; the request owns the transaction."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.types import JobStatus, JobType
from san_common.models import (
    AsyncJob,
    DailySummary,
    GithubAccount,
    GithubOAuthState,
    GithubRepository,
    GithubStarRecommendation,
    TilGithubCommit,
)

ACTIVE_COMMIT_STATUSES = ("PENDING", "PROCESSING", "COMPLETED")

# -- accounts ----------------------------------------------------------------------------------


async def get_account(session: AsyncSession, user_id: uuid.UUID) -> GithubAccount | None:
    return await session.get(GithubAccount, user_id)


async def upsert_account(
    session: AsyncSession,
    user_id: uuid.UUID,
    *,
    login: str,
    github_user_id: int | None,
    encrypted_token: str,
) -> GithubAccount:
    """Link, or relink (a new token replaces the old one; `linked_at` is the first link)."""
    values = {"login": login, "github_user_id": github_user_id, "encrypted_token": encrypted_token}
    account = await session.scalar(
        insert(GithubAccount)
        .values(user_id=user_id, **values)
        .on_conflict_do_update(
            index_elements=["user_id"], set_={**values, "updated_at": func.now()}
        )
        .returning(GithubAccount)
        .execution_options(populate_existing=True)
    )
    assert account is not None
    return account


async def delete_account(session: AsyncSession, user_id: uuid.UUID) -> bool:
    result = await session.execute(delete(GithubAccount).where(GithubAccount.user_id == user_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


# -- OAuth states ------------------------------------------------------------------------------


async def prune_oauth_states(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Forget this user's used and expired states (they can never be accepted again)."""
    await session.execute(
        delete(GithubOAuthState).where(
            GithubOAuthState.user_id == user_id,
            (GithubOAuthState.used_at.is_not(None)) | (GithubOAuthState.expires_at <= func.now()),
        )
    )


async def keep_newest_oauth_states(session: AsyncSession, user_id: uuid.UUID, keep: int) -> None:
    """Forget all but this user's `keep` newest states: a flow started earlier than those is
    abandoned (the user started again), so the table stays bounded per user however often
    the flow is started."""
    newest = (
        select(GithubOAuthState.state_hash)
        .where(GithubOAuthState.user_id == user_id)
        .order_by(GithubOAuthState.created_at.desc(), GithubOAuthState.state_hash)
        .limit(keep)
    )
    await session.execute(
        delete(GithubOAuthState).where(
            GithubOAuthState.user_id == user_id, GithubOAuthState.state_hash.not_in(newest)
        )
    )


async def insert_oauth_state(
    session: AsyncSession,
    *,
    state_hash: str,
    user_id: uuid.UUID,
    encrypted_code_verifier: str,
    expires_at: datetime,
) -> None:
    await session.execute(
        insert(GithubOAuthState).values(
            state_hash=state_hash,
            user_id=user_id,
            encrypted_code_verifier=encrypted_code_verifier,
            expires_at=expires_at,
        )
    )


@dataclass(frozen=True)
class ConsumedState:
    user_id: uuid.UUID
    encrypted_code_verifier: str


async def consume_oauth_state(session: AsyncSession, state_hash: str) -> ConsumedState | None:
    """Mark an unused, unexpired state used and return it; None for any other state.

    A concurrent second use waits for the first's row lock, then finds it used.
    """
    row = (
        await session.execute(
            update(GithubOAuthState)
            .where(
                GithubOAuthState.state_hash == state_hash,
                GithubOAuthState.used_at.is_(None),
                GithubOAuthState.expires_at > func.now(),
            )
            .values(used_at=func.now())
            .returning(GithubOAuthState.user_id, GithubOAuthState.encrypted_code_verifier)
        )
    ).first()
    return None if row is None else ConsumedState(row[0], row[1])


# -- repositories ------------------------------------------------------------------------------


async def insert_repository(
    session: AsyncSession,
    user_id: uuid.UUID,
    *,
    owner: str,
    name: str,
    branch: str | None,
    directory: str | None,
) -> GithubRepository | None:
    """None when the user already connected this repository."""
    return await session.scalar(
        insert(GithubRepository)
        .values(user_id=user_id, owner=owner, name=name, branch=branch, directory=directory)
        .on_conflict_do_nothing(index_elements=["user_id", "owner", "name"])
        .returning(GithubRepository)
    )


async def list_repositories(session: AsyncSession, user_id: uuid.UUID) -> list[GithubRepository]:
    rows = await session.scalars(
        select(GithubRepository)
        .where(GithubRepository.user_id == user_id)
        .order_by(GithubRepository.created_at, GithubRepository.id)
    )
    return list(rows)


async def delete_repository(
    session: AsyncSession, user_id: uuid.UUID, repository_id: uuid.UUID
) -> bool:
    result = await session.execute(
        delete(GithubRepository).where(
            GithubRepository.id == repository_id, GithubRepository.user_id == user_id
        )
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


# -- TIL commits -------------------------------------------------------------------------------


async def get_summary(
    session: AsyncSession, user_id: uuid.UUID, summary_id: uuid.UUID
) -> DailySummary | None:
    return await session.scalar(
        select(DailySummary).where(DailySummary.id == summary_id, DailySummary.user_id == user_id)
    )


async def lock_user_commits(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Serialize this user's commit requests until the transaction ends, so two requests
    cannot both pass the duplicate check or pick the same file path."""
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('san-til-commit:' || :user_id, 0))"),
        {"user_id": str(user_id)},
    )


async def has_active_commit(session: AsyncSession, user_id: uuid.UUID, content_hash: str) -> bool:
    found = await session.scalar(
        select(TilGithubCommit.id).where(
            TilGithubCommit.user_id == user_id,
            TilGithubCommit.content_hash == content_hash,
            TilGithubCommit.status.in_(ACTIVE_COMMIT_STATUSES),
        )
    )
    return found is not None


async def reserved_paths(
    session: AsyncSession, user_id: uuid.UUID, owner: str, name: str
) -> set[str]:
    """Paths this user's live or done commits hold in that repository (not yet on GitHub,
    for the live ones, so GitHub alone cannot tell)."""
    rows = await session.scalars(
        select(TilGithubCommit.file_path).where(
            TilGithubCommit.user_id == user_id,
            func.lower(TilGithubCommit.repo_owner) == owner.lower(),
            func.lower(TilGithubCommit.repo_name) == name.lower(),
            TilGithubCommit.status.in_(ACTIVE_COMMIT_STATUSES),
        )
    )
    return set(rows)


async def insert_commit(
    session: AsyncSession,
    *,
    user_id: uuid.UUID,
    summary_id: uuid.UUID,
    repository: GithubRepository,
    file_path: str,
    content: str,
    content_hash: str,
) -> uuid.UUID | None:
    """None when an active commit with this content exists (the partial unique index)."""
    return await session.scalar(
        insert(TilGithubCommit)
        .values(
            user_id=user_id,
            summary_id=summary_id,
            repository_id=repository.id,
            repo_owner=repository.owner,
            repo_name=repository.name,
            branch=repository.branch,
            file_path=file_path,
            content=content,
            content_hash=content_hash,
        )
        .on_conflict_do_nothing(
            index_elements=["user_id", "content_hash"],
            # a literal predicate, so PostgreSQL can match it to the partial index
            index_where=text("status IN ('PENDING', 'PROCESSING', 'COMPLETED')"),
        )
        .returning(TilGithubCommit.id)
    )


async def list_commits(
    session: AsyncSession, user_id: uuid.UUID, summary_id: uuid.UUID
) -> list[tuple[TilGithubCommit, uuid.UUID | None]]:
    """The summary's commits, newest first, each with its newest job's id."""
    latest_job = (
        select(AsyncJob.job_id)
        .where(
            AsyncJob.target_id == TilGithubCommit.id,
            AsyncJob.job_type == JobType.TIL_GITHUB_COMMIT.value,
        )
        .order_by(AsyncJob.created_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    rows = await session.execute(
        select(TilGithubCommit, latest_job)
        .where(TilGithubCommit.user_id == user_id, TilGithubCommit.summary_id == summary_id)
        .order_by(TilGithubCommit.created_at.desc(), TilGithubCommit.id)
    )
    return [(commit, job_id) for commit, job_id in rows.all()]


# -- star recommendations ----------------------------------------------------------------------


async def latest_star_job(session: AsyncSession, user_id: uuid.UUID) -> AsyncJob | None:
    return await session.scalar(
        select(AsyncJob)
        .where(
            AsyncJob.user_id == user_id,
            AsyncJob.job_type == JobType.GITHUB_STAR_RECOMMENDATION.value,
            AsyncJob.status == JobStatus.COMPLETED.value,
        )
        .order_by(AsyncJob.finished_at.desc().nulls_last(), AsyncJob.created_at.desc())
        .limit(1)
    )


async def star_recommendations(
    session: AsyncSession, user_id: uuid.UUID, job_id: uuid.UUID
) -> list[GithubStarRecommendation]:
    rows = await session.scalars(
        select(GithubStarRecommendation)
        .where(
            GithubStarRecommendation.user_id == user_id, GithubStarRecommendation.job_id == job_id
        )
        .order_by(GithubStarRecommendation.rank)
    )
    return list(rows)
