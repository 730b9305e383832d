"""How a GitHub answer is classified (docs/reference/job-rules.md §2.5): what retrying can fix and
what it cannot.

The classes extend the worker errors, so a job handler lets them propagate and the runtime
does the right thing; the API maps them to problem+json. Messages name the method, path and
status, and GitHub's own `message` with any credential redacted — never the token.
"""

from __future__ import annotations

from san_common.errors import PermanentJobError, TransientJobError

RELINK_MESSAGE = "GitHub rejected the token (revoked or expired): relink GitHub"


class GithubPermanentError(PermanentJobError):
    """A 4xx that retrying cannot fix (no access, bad request, gone)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GithubNotFound(GithubPermanentError):
    """404: the repository (or path) does not exist, or the token may not see it."""


class GithubTokenRejected(GithubPermanentError):
    """401: the token is revoked, expired or wrong. Only relinking helps."""

    public_reason = RELINK_MESSAGE  # what its owner must do: fixed text, safe to show

    def __init__(self, detail: str = "") -> None:
        super().__init__(RELINK_MESSAGE + (f" ({detail})" if detail else ""), status=401)


class GithubTransientError(TransientJobError):
    """5xx, timeouts, resets and rate limits; `retry_after` when GitHub said how long to wait."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, retry_after=retry_after)
        self.status = status


class GithubRateLimited(GithubTransientError):
    """403/429 with `retry-after` or an exhausted `x-ratelimit-remaining`."""
