"""`POST /til/{summaryId}/github-commits` (docs/reference/job-rules.md §3.3): the six checks, in
order, each with its own error, then the commit row and its job in the request's transaction.

1. the TIL is COMPLETED (else TIL_NOT_COMPLETED, 400);
2. GitHub is linked (GITHUB_NOT_LINKED, 400);
3. exactly one repository is connected (REPOSITORY_NOT_CONNECTED / MULTIPLE_REPOSITORIES, 400);
4. no commit of the same content is PENDING/PROCESSING/COMPLETED (DUPLICATE_RESOURCE, 409);
5. a file path no file occupies on GitHub (`TIL/2026-12-02.md`, then `-1`, `-2`, …);
6. insert `til_github_commits` + register TIL_GITHUB_COMMIT → 202.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from san_api import errors
from san_api.github import repository, service
from san_api.github.clients import GithubServices
from san_api.github.upstream import github_errors
from san_common.jobs.registration import register_job_in_transaction
from san_common.jobs.types import JobType
from san_common.models import GithubRepository, TilGithubCommit

DEFAULT_DIRECTORY = "TIL"


@dataclass(frozen=True)
class AcceptedCommit:
    commit_id: uuid.UUID
    job_id: uuid.UUID
    file_path: str


async def request_commit(
    session: AsyncSession,
    github: GithubServices,
    user_id: uuid.UUID,
    summary_id: uuid.UUID,
    *,
    max_suffix: int,
) -> AcceptedCommit:
    summary = await repository.get_summary(session, user_id, summary_id)
    if summary is None:
        raise errors.NotFound(f"TIL {summary_id} not found")
    if summary.status != "COMPLETED" or not summary.til_markdown:
        raise errors.TilNotCompleted(f"TIL {summary_id} is {summary.status}, not COMPLETED")
    account = await repository.get_account(session, user_id)
    if account is None:
        raise errors.GithubNotLinked("link GitHub with PUT /me/github or the OAuth flow first")
    connected = await repository.list_repositories(session, user_id)
    if not connected:
        raise errors.RepositoryNotConnected("connect one with POST /me/github/repositories")
    if len(connected) > 1:
        raise errors.MultipleRepositories(
            f"{len(connected)} repositories are connected; disconnect all but one"
        )
    target = connected[0]

    content = summary.til_markdown
    content_hash = hashlib.sha256(content.encode("utf-8")).hexdigest()
    await repository.lock_user_commits(session, user_id)
    if await repository.has_active_commit(session, user_id, content_hash):
        raise errors.DuplicateResource(
            "this TIL content is already committed or being committed", contentHash=content_hash
        )

    token = service.token_of(github, account)
    stem = f"{target.directory or DEFAULT_DIRECTORY}/{summary.target_date.isoformat()}"
    reserved = await repository.reserved_paths(session, user_id, target.owner, target.name)
    file_path = await _free_path(github, token, target, stem, reserved, max_suffix)

    commit_id = await repository.insert_commit(
        session,
        user_id=user_id,
        summary_id=summary.id,
        repository=target,
        file_path=file_path,
        content=content,
        content_hash=content_hash,
    )
    if commit_id is None:  # the lock makes this unreachable; the index stays the backstop
        raise errors.DuplicateResource("this TIL content is already committed or being committed")
    job = await register_job_in_transaction(
        session, job_type=JobType.TIL_GITHUB_COMMIT, target_id=commit_id, user_id=user_id
    )
    return AcceptedCommit(commit_id, job.job_id, file_path)


async def _free_path(
    github: GithubServices,
    token: str,
    target: GithubRepository,
    stem: str,
    reserved: set[str],
    max_suffix: int,
) -> str:
    for n in range(max_suffix + 1):
        candidate = f"{stem}.md" if n == 0 else f"{stem}-{n}.md"
        if candidate in reserved:
            continue
        with github_errors():
            existing = await github.api.get_contents(
                token, target.owner, target.name, candidate, ref=target.branch
            )
        if existing is None:
            return candidate
    raise errors.FilePathUnavailable(f"{stem}.md and its {max_suffix} numbered variants are taken")


async def list_commits(
    session: AsyncSession, user_id: uuid.UUID, summary_id: uuid.UUID
) -> list[tuple[TilGithubCommit, uuid.UUID | None]]:
    if await repository.get_summary(session, user_id, summary_id) is None:
        raise errors.NotFound(f"TIL {summary_id} not found")
    return await repository.list_commits(session, user_id, summary_id)
