"""TIL_GITHUB_COMMIT: put a TIL file into the user's repository, exactly once
(docs/reference/job-rules.md §3.3).

`load` reads the commit row (its own short transaction); `run` talks to GitHub with no
transaction open; `store` records sha + URL in the transaction that completes the job. The
commit row's status follows the job's (PROCESSING, COMPLETED, FAILED, back to PENDING):
the runtime writes it, from the job type's registry entry.

Exactly-once effect: a PUT whose answer was lost may still have committed. So before
writing, `run` looks at the path: our exact content there (same git blob sha) means an
earlier try succeeded — the job completes with that file's latest commit and no second
commit is made. Other content there means someone else wrote the path after it was
chosen: that fails the job (overwriting a file we did not write is never right).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date

from sqlalchemy.ext.asyncio import AsyncSession

from san_common.crypto import DecryptionFailed, Purpose, TokenCipher
from san_common.errors import PermanentJobError, TransientJobError
from san_common.github import ContentEntry, GithubClient, GithubPermanentError, git_blob_sha
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, handles
from san_github_worker import repository
from san_github_worker.locks import UserLocks

UNDECRYPTABLE = (
    "the stored GitHub token cannot be decrypted (its key is no longer configured, or it "
    "was not stored for this user): relink GitHub"
)


@dataclass(frozen=True)
class CommitWork:
    commit_id: uuid.UUID
    user_id: uuid.UUID
    owner: str
    name: str
    branch: str | None
    path: str
    content: str
    day: date | None
    encrypted_token: str


@dataclass(frozen=True)
class Pushed:
    sha: str | None
    url: str | None
    reused: bool  # True when an earlier try's commit was found instead of making one


@handles(JobType.TIL_GITHUB_COMMIT)
class TilGithubCommitHandler(JobHandler[CommitWork | None, Pushed | None]):
    def __init__(self, github: GithubClient, cipher: TokenCipher, locks: UserLocks) -> None:
        self._github = github
        self._cipher = cipher
        self._locks = locks

    async def load(self, session: AsyncSession, job: AsyncJob) -> CommitWork | None:
        commit = await repository.get_commit(session, job.target_id)
        if commit is None:
            raise PermanentJobError(f"til_github_commit {job.target_id} does not exist")
        if commit.status == "COMPLETED":
            return None  # an earlier job for this commit finished it
        encrypted = await repository.get_encrypted_token(session, commit.user_id)
        if encrypted is None:
            raise PermanentJobError(
                "GitHub is no longer linked: link GitHub and request the commit again"
            )
        return CommitWork(
            commit_id=commit.id,
            user_id=commit.user_id,
            owner=commit.repo_owner,
            name=commit.repo_name,
            branch=commit.branch,
            path=commit.file_path,
            content=commit.content,
            day=await repository.summary_date(session, commit.summary_id),
            encrypted_token=encrypted,
        )

    async def run(self, job: AsyncJob, work: CommitWork | None) -> Pushed | None:
        if work is None:
            return None
        try:
            token = self._cipher.decrypt(
                work.encrypted_token, user_id=work.user_id, purpose=Purpose.GITHUB_TOKEN
            )
        except DecryptionFailed as exc:
            raise PermanentJobError(UNDECRYPTABLE) from exc
        content = work.content.encode("utf-8")
        async with self._locks.hold(work.user_id):
            existing = await self._github.get_contents(
                token, work.owner, work.name, work.path, ref=work.branch
            )
            if existing is not None:
                return await self._found(token, work, existing, content)
            try:
                commit = await self._github.put_contents(
                    token,
                    work.owner,
                    work.name,
                    work.path,
                    content=content,
                    message=f"Add TIL {work.day.isoformat() if work.day else work.path}",
                    branch=work.branch,
                )
            except GithubPermanentError as exc:
                if exc.status in (409, 422):
                    # The path changed between our look and our write: look again.
                    raise TransientJobError(f"{work.path} changed during the commit") from exc
                raise
        return Pushed(commit.sha, commit.html_url, reused=False)

    async def _found(
        self, token: str, work: CommitWork, existing: ContentEntry, content: bytes
    ) -> Pushed:
        if existing.type != "file" or existing.sha != git_blob_sha(content):
            raise PermanentJobError(
                f"{work.path} in {work.owner}/{work.name} now holds other content (it was free "
                "when the commit was requested); request the commit again to choose a new path"
            )
        last = await self._github.last_commit_for_path(
            token, work.owner, work.name, work.path, ref=work.branch
        )
        if last is None:
            return Pushed(None, existing.html_url, reused=True)
        return Pushed(last.sha, last.html_url, reused=True)

    async def store(self, session: AsyncSession, job: AsyncJob, result: Pushed | None) -> None:
        if result is not None:
            await repository.complete(session, job.target_id, result.sha, result.url)
