"""The github-worker's handlers: every class marked `@handles(...)` in its handler module."""

from __future__ import annotations

from typing import Any

from san_common.crypto import TokenCipher
from san_common.github import GithubClient
from san_common.jobs import registry
from san_common.worker import JobHandler, collect
from san_github_worker.locks import UserLocks


def build_handlers(
    github: GithubClient, cipher: TokenCipher, locks: UserLocks
) -> dict[str, JobHandler[Any, Any]]:
    return collect(
        "san_github_worker.til_commit",
        consumer=registry.GITHUB_WORKER,
        github=github,
        cipher=cipher,
        locks=locks,
    )
