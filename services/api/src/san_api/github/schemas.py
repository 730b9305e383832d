from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# GitHub's own rules: logins are alphanumeric with inner single hyphens, ≤ 39 characters;
# repository names are letters, digits, '.', '-', '_', ≤ 100 characters.
OWNER_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,37}[A-Za-z0-9])?$"
REPO_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"
_BAD_REF = re.compile(r"(^[-/.])|(\.\.)|(//)|([/.]$)|(@\{)|(\.lock$)|[\s~^:?*\[\\\x00-\x1f\x7f]")


def _owner(value: str) -> str:
    if "--" in value:
        raise ValueError("must not contain consecutive hyphens")
    return value


def _repo_name(value: str) -> str:
    if value in (".", ".."):
        raise ValueError("is not a repository name")
    return value


def _branch(value: str | None) -> str | None:
    if value is not None and _BAD_REF.search(value):
        raise ValueError("is not a valid git branch name")
    return value


def _directory(value: str | None) -> str | None:
    if value is None:
        return None
    parts = value.strip().strip("/").split("/")
    if not parts or parts == [""]:
        raise ValueError("must name a folder (omit it to use the default 'TIL')")
    for part in parts:
        if part in ("", ".", "..") or re.search(r"[\x00-\x1f\x7f\\]", part) or part != part.strip():
            raise ValueError("must be a relative folder path without '.', '..' or empty parts")
    return "/".join(parts)


AccessToken = Annotated[
    str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.\-]+$", repr=False)
]


class LinkToken(BaseModel):
    model_config = ConfigDict(extra="forbid")

    accessToken: AccessToken = Field(description="A GitHub token (validated with GET /user)")


class GithubAccountView(BaseModel):
    login: str
    githubUserId: int | None
    linkedAt: datetime
    updatedAt: datetime


class OAuthStart(BaseModel):
    authorizeUrl: str = Field(description="Send the user's browser here")
    expiresAt: datetime = Field(description="The authorization must finish before this")


OAuthCode = Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[\x21-\x7e]+$")]


class OAuthComplete(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: OAuthCode = Field(description="The `code` GitHub appended to the callback URL")
    state: OAuthCode = Field(description="The `state` GitHub appended to the callback URL")


class OAuthCallback(BaseModel):
    """What GitHub's redirect carried. Nothing is linked until the user completes it."""

    code: str
    state: str
    linked: bool = Field(description="Always false: linking needs the user's bearer token")
    next: str = Field(description="How to finish linking")


class RepositoryCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    owner: Annotated[str, Field(pattern=OWNER_PATTERN), AfterValidator(_owner)]
    name: Annotated[str, Field(pattern=REPO_PATTERN), AfterValidator(_repo_name)]
    branch: Annotated[str | None, Field(min_length=1, max_length=255), AfterValidator(_branch)] = (
        Field(default=None, description="Defaults to the repository's default branch")
    )
    directory: Annotated[
        str | None,
        Field(min_length=1, max_length=200),
        AfterValidator(_directory),
    ] = Field(default=None, description="Folder for TIL files; default 'TIL'")


class RepositoryView(BaseModel):
    repositoryId: uuid.UUID
    owner: str
    name: str
    branch: str | None
    directory: str | None
    createdAt: datetime


class RepositoryList(BaseModel):
    repositories: list[RepositoryView]


class CommitAccepted(BaseModel):
    commitId: uuid.UUID
    jobId: uuid.UUID
    targetId: uuid.UUID = Field(description="The job's target: the commit id")
    filePath: str


class CommitView(BaseModel):
    commitId: uuid.UUID
    jobId: uuid.UUID | None
    status: str
    repository: str = Field(description="owner/name")
    branch: str | None
    filePath: str
    contentHash: str
    commitSha: str | None
    commitUrl: str | None
    errorMessage: str | None
    createdAt: datetime
    updatedAt: datetime


class CommitList(BaseModel):
    commits: list[CommitView]


class StarJobAccepted(BaseModel):
    jobId: uuid.UUID
    targetId: uuid.UUID = Field(description="The job's target: the user's id")


class StarRecommendationView(BaseModel):
    rank: int
    repoFullName: str
    htmlUrl: str | None
    description: str | None
    reason: str
    score: float


class StarRecommendationList(BaseModel):
    jobId: uuid.UUID | None = Field(
        description="The job that produced these; null before the first"
    )
    generatedAt: datetime | None
    recommendations: list[StarRecommendationView]
