"""The github-worker's registry: the job types it consumes and their handlers."""

from __future__ import annotations

from typing import Any

from san_common.crypto import TokenCipher
from san_common.github import GithubClient
from san_common.worker import JobHandler
from san_github_worker.locks import UserLocks
from san_github_worker.til_commit import TilGithubCommitHandler


def build_handlers(
    github: GithubClient, cipher: TokenCipher, locks: UserLocks
) -> dict[str, JobHandler[Any, Any]]:
    handlers: list[JobHandler[Any, Any]] = [TilGithubCommitHandler(github, cipher, locks)]
    return {str(h.job_type): h for h in handlers}
