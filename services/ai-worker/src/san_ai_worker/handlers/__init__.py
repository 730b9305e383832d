"""One module per job type, its handler class marked `@handles(JobType.X)`."""

from __future__ import annotations

from typing import Any

from san_ai_worker.ai.provider import AiProvider
from san_common.crypto import TokenCipher
from san_common.github import GithubClient
from san_common.jobs import registry
from san_common.worker import JobHandler, collect


def build_handlers(
    ai: AiProvider, *, github: GithubClient | None = None, cipher: TokenCipher | None = None
) -> dict[str, JobHandler[Any, Any]]:
    """Every AI job type; GITHUB_STAR_RECOMMENDATION only with GitHub access (`main` always
    gives it; test harnesses of the other job types may leave it out)."""
    return collect(__name__, consumer=registry.AI_WORKER, ai=ai, github=github, cipher=cipher)
