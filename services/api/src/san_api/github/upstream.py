"""GitHub's failures, as the API's problem+json errors.

401 → GITHUB_TOKEN_REJECTED (400, relink); 404 → the caller's own error; rate limits, 5xx
and timeouts → GITHUB_UNAVAILABLE (503, with `retryAfterSeconds` when GitHub named a wait);
anything else → GITHUB_ERROR (502). The caller reads a sanitized summary (the kind of
failure and GitHub's status, san_common.errors.summarize), never GitHub's body: that may carry
markup or internal details. The full message, token redacted, is logged for operators.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Any

from san_api import errors
from san_common.errors import summarize
from san_common.github import (
    RELINK_MESSAGE,
    GithubNotFound,
    GithubPermanentError,
    GithubTokenRejected,
    GithubTransientError,
)

log = logging.getLogger(__name__)


def public_reason(exc: Exception) -> str:
    """What the caller may read of a failed GitHub call; the full message goes to the log."""
    log.warning("GitHub call failed: %s", exc)
    return summarize(exc, "the GitHub call")


@contextlib.contextmanager
def github_errors(*, not_found: errors.AppError | None = None) -> Iterator[None]:
    try:
        yield
    except GithubTokenRejected:
        raise errors.GithubTokenRejected(RELINK_MESSAGE) from None
    except GithubNotFound as exc:
        raise (not_found or errors.GithubFailed(public_reason(exc))) from None
    except GithubTransientError as exc:
        wait = math.ceil(exc.retry_after) if exc.retry_after is not None else None
        extra: dict[str, Any] = {} if wait is None else {"retryAfterSeconds": wait}
        raise errors.GithubUnavailable(
            public_reason(exc), headers={"Retry-After": str(wait or 30)}, **extra
        ) from None
    except GithubPermanentError as exc:
        raise errors.GithubFailed(public_reason(exc)) from None
