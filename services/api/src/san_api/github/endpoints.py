from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from san_api import errors
from san_api.deps import CurrentUser, SessionDep, SettingsDep
from san_api.github import commits, oauth, service, stars
from san_api.github.clients import GithubDep
from san_api.github.schemas import (
    CommitAccepted,
    CommitList,
    CommitView,
    GithubAccountView,
    LinkToken,
    OAuthCallback,
    OAuthComplete,
    OAuthStart,
    RepositoryCreate,
    RepositoryList,
    RepositoryView,
    StarJobAccepted,
    StarRecommendationList,
    StarRecommendationView,
)
from san_api.limits.dependencies import job_limits, upstream_limit
from san_api.openapi import problems
from san_common.jobs.types import JobType
from san_common.models import GithubAccount, GithubRepository, TilGithubCommit

router = APIRouter(tags=["github"])


@router.put(
    "/me/github",
    response_model=GithubAccountView,
    dependencies=upstream_limit("github-link"),
    responses=problems(errors.GithubTokenRejected, errors.GithubUnavailable, errors.GithubFailed),
)
async def link_github(
    body: LinkToken, user: CurrentUser, session: SessionDep, github: GithubDep
) -> GithubAccountView:
    """Link (or relink) GitHub with an access token; GitHub validates it first."""
    return _account_view(await service.link(session, github, user.user_id, body.accessToken))


@router.get("/me/github", response_model=GithubAccountView, responses=problems(errors.NotFound))
async def get_github(user: CurrentUser, session: SessionDep) -> GithubAccountView:
    """The linked account (never the token)."""
    return _account_view(await service.get_account(session, user.user_id))


@router.delete(
    "/me/github", status_code=status.HTTP_204_NO_CONTENT, responses=problems(errors.NotFound)
)
async def unlink_github(user: CurrentUser, session: SessionDep) -> Response:
    await service.unlink(session, user.user_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/me/github/oauth/authorize",
    response_model=OAuthStart,
    dependencies=upstream_limit("github-oauth-authorize"),
    responses=problems(errors.OAuthNotConfigured),
)
async def start_oauth(
    user: CurrentUser, session: SessionDep, github: GithubDep, settings: SettingsDep
) -> OAuthStart:
    """Start the OAuth web flow: send the user's browser to `authorizeUrl`."""
    url, expires_at = await oauth.start(session, github, settings, user.user_id)
    return OAuthStart(authorizeUrl=url, expiresAt=expires_at)


@router.get(
    "/github/oauth/callback",
    response_model=OAuthCallback,
    responses=problems(errors.OAuthStateInvalid, errors.OAuthCodeRejected),
)
async def oauth_callback(
    code: Annotated[str | None, Query(max_length=512)] = None,
    state: Annotated[str | None, Query(max_length=512)] = None,
    error: Annotated[str | None, Query(max_length=512)] = None,
) -> OAuthCallback:
    """Where GitHub sends the browser back. It links nothing and writes nothing: a browser
    can be sent here with someone else's `state`. The signed-in client finishes with
    `POST /me/github/oauth/complete` (docs/github.md)."""
    return OAuthCallback.model_validate(oauth.callback(code=code, state=state, error=error))


@router.post(
    "/me/github/oauth/complete",
    response_model=GithubAccountView,
    dependencies=upstream_limit("github-oauth-complete"),
    responses=problems(
        errors.OAuthStateInvalid,
        errors.OAuthStateNotYours,
        errors.OAuthCodeRejected,
        errors.GithubTokenRejected,
        errors.GithubUnavailable,
        errors.GithubFailed,
    ),
)
async def complete_oauth(
    body: OAuthComplete,
    user: CurrentUser,
    session: SessionDep,
    github: GithubDep,
    settings: SettingsDep,
) -> GithubAccountView:
    """Finish the OAuth flow as the signed-in user: the state must be one this user started."""
    account = await oauth.complete(
        session, github, settings, user.user_id, code=body.code, state=body.state
    )
    return _account_view(account)


@router.post(
    "/me/github/repositories",
    status_code=status.HTTP_201_CREATED,
    response_model=RepositoryView,
    dependencies=upstream_limit("github-repositories"),
    responses=problems(
        errors.GithubNotLinked,
        errors.GithubRepositoryNotFound,
        errors.RepositoryNotWritable,
        errors.DuplicateResource,
        errors.GithubTokenRejected,
        errors.GithubUnavailable,
        errors.GithubFailed,
    ),
)
async def connect_repository(
    body: RepositoryCreate, user: CurrentUser, session: SessionDep, github: GithubDep
) -> RepositoryView:
    """Connect a repository the linked token may push to."""
    return _repository_view(await service.connect_repository(session, github, user.user_id, body))


@router.get("/me/github/repositories", response_model=RepositoryList)
async def list_repositories(user: CurrentUser, session: SessionDep) -> RepositoryList:
    rows = await service.list_repositories(session, user.user_id)
    return RepositoryList(repositories=[_repository_view(r) for r in rows])


@router.delete("/me/github/repositories/{repositoryId}", status_code=status.HTTP_204_NO_CONTENT)
async def disconnect_repository(
    repositoryId: uuid.UUID, user: CurrentUser, session: SessionDep
) -> Response:
    await service.disconnect_repository(session, user.user_id, repositoryId)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/til/{summaryId}/github-commits",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=CommitAccepted,
    dependencies=job_limits("github-commits"),
    responses=problems(
        errors.TilNotCompleted,
        errors.GithubNotLinked,
        errors.RepositoryNotConnected,
        errors.MultipleRepositories,
        errors.DuplicateResource,
        errors.FilePathUnavailable,
        errors.GithubTokenRejected,
        errors.GithubUnavailable,
        errors.GithubFailed,
    ),
)
async def commit_til(
    summaryId: uuid.UUID,
    user: CurrentUser,
    session: SessionDep,
    github: GithubDep,
    settings: SettingsDep,
) -> CommitAccepted:
    """Push a completed TIL to the connected repository (an async TIL_GITHUB_COMMIT job)."""
    accepted = await commits.request_commit(
        session, github, user.user_id, summaryId, max_suffix=settings.til_commit_max_path_suffix
    )
    return CommitAccepted(
        commitId=accepted.commit_id,
        jobId=accepted.job_id,
        targetId=accepted.commit_id,
        filePath=accepted.file_path,
    )


@router.get("/til/{summaryId}/github-commits", response_model=CommitList)
async def list_til_commits(
    summaryId: uuid.UUID, user: CurrentUser, session: SessionDep
) -> CommitList:
    rows = await commits.list_commits(session, user.user_id, summaryId)
    return CommitList(commits=[_commit_view(commit, job_id) for commit, job_id in rows])


@router.post(
    "/github-star-recommendations",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=StarJobAccepted,
    dependencies=job_limits(
        "github-star-recommendations", ai_jobs=(JobType.GITHUB_STAR_RECOMMENDATION,)
    ),
    responses=problems(errors.GithubNotLinked, errors.DuplicateResource),
)
async def request_star_recommendations(user: CurrentUser, session: SessionDep) -> StarJobAccepted:
    """Recommend repositories from the user's GitHub stars (an async job)."""
    job_id = await stars.request_recommendations(session, user.user_id)
    return StarJobAccepted(jobId=job_id, targetId=user.user_id)


@router.get("/github-star-recommendations", response_model=StarRecommendationList)
async def latest_star_recommendations(
    user: CurrentUser, session: SessionDep
) -> StarRecommendationList:
    latest = await stars.latest(session, user.user_id)
    return StarRecommendationList(
        jobId=latest.job_id,
        generatedAt=latest.generated_at,
        recommendations=[
            StarRecommendationView(
                rank=r.rank,
                repoFullName=r.repo_full_name,
                htmlUrl=r.html_url,
                description=r.description,
                reason=r.reason,
                score=r.score,
            )
            for r in latest.recommendations
        ],
    )


def _account_view(account: GithubAccount) -> GithubAccountView:
    return GithubAccountView(
        login=account.login,
        githubUserId=account.github_user_id,
        linkedAt=account.linked_at,
        updatedAt=account.updated_at,
    )


def _repository_view(row: GithubRepository) -> RepositoryView:
    return RepositoryView(
        repositoryId=row.id,
        owner=row.owner,
        name=row.name,
        branch=row.branch,
        directory=row.directory,
        createdAt=row.created_at,
    )


def _commit_view(commit: TilGithubCommit, job_id: uuid.UUID | None) -> CommitView:
    return CommitView(
        commitId=commit.id,
        jobId=job_id,
        status=commit.status,
        repository=f"{commit.repo_owner}/{commit.repo_name}",
        branch=commit.branch,
        filePath=commit.file_path,
        contentHash=commit.content_hash,
        commitSha=commit.commit_sha,
        commitUrl=commit.commit_url,
        errorMessage=commit.error_message,
        createdAt=commit.created_at,
        updatedAt=commit.updated_at,
    )
