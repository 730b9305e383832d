from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    CHAR,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base, created_at, updated_at, uuid_pk


class GithubAccount(Base):
    """A user's linked GitHub account. The token is stored only encrypted (san_common.crypto)."""

    __tablename__ = "github_accounts"

    user_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    login: Mapped[str] = mapped_column(Text)
    github_user_id: Mapped[int | None] = mapped_column(BigInteger)
    encrypted_token: Mapped[str] = mapped_column(Text)
    linked_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()


class GithubOAuthState(Base):
    """A pending OAuth web-flow login: single-use `state` (stored hashed) and PKCE verifier."""

    __tablename__ = "github_oauth_states"

    state_hash: Mapped[str] = mapped_column(CHAR(64), primary_key=True)
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    encrypted_code_verifier: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at()
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class GithubRepository(Base):
    __tablename__ = "github_repositories"
    __table_args__ = (UniqueConstraint("user_id", "owner", "name"),)

    id: Mapped[uuid.UUID] = uuid_pk()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    owner: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    branch: Mapped[str | None] = mapped_column(Text)
    directory: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at()


class TilGithubCommit(Base):
    """A TIL pushed (or being pushed) to GitHub; keeps its own status next to its job's."""

    __tablename__ = "til_github_commits"
    __table_args__ = (
        CheckConstraint(
            "status IN ('PENDING', 'PROCESSING', 'COMPLETED', 'FAILED')", name="status"
        ),
        # docs/reference/job-rules.md §3.3 check 4, enforced by the database as well as by the API.
        Index(
            "uk_til_github_commits_active_content",
            "user_id",
            "content_hash",
            unique=True,
            postgresql_where=text("status IN ('PENDING', 'PROCESSING', 'COMPLETED')"),
        ),
        Index("ix_til_github_commits_summary_id", "summary_id"),
    )

    id: Mapped[uuid.UUID] = uuid_pk()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    summary_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("daily_summaries.id", ondelete="CASCADE")
    )
    repository_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("github_repositories.id", ondelete="SET NULL")
    )
    repo_owner: Mapped[str] = mapped_column(Text)
    repo_name: Mapped[str] = mapped_column(Text)
    branch: Mapped[str | None] = mapped_column(Text)
    file_path: Mapped[str] = mapped_column(Text)
    content: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(CHAR(64))
    status: Mapped[str] = mapped_column(Text, server_default="PENDING")
    commit_sha: Mapped[str | None] = mapped_column(Text)
    commit_url: Mapped[str | None] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()


class GithubStarRecommendation(Base):
    __tablename__ = "github_star_recommendations"
    __table_args__ = (Index("ix_github_star_recommendations_user_id_job_id", "user_id", "job_id"),)

    id: Mapped[uuid.UUID] = uuid_pk()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    # The GITHUB_STAR_RECOMMENDATION job that produced it; the newest job's rows are "latest".
    job_id: Mapped[uuid.UUID]
    rank: Mapped[int] = mapped_column(Integer)
    repo_full_name: Mapped[str] = mapped_column(Text)
    html_url: Mapped[str | None] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    score: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = created_at()
