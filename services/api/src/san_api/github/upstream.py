"""GitHub's failures, as the API's problem+json errors.

401 → GITHUB_TOKEN_REJECTED (400, relink); 404 → the caller's own error; rate limits, 5xx
and timeouts → GITHUB_UNAVAILABLE (503, with `retryAfterSeconds` when GitHub named a wait);
anything else → GITHUB_ERROR (502). The messages carry no token (san_common.github).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

from san_api import errors
from san_common.github import (
    RELINK_MESSAGE,
    GithubNotFound,
    GithubPermanentError,
    GithubTokenRejected,
    GithubTransientError,
)


@contextlib.contextmanager
def github_errors(*, not_found: errors.AppError | None = None) -> Iterator[None]:
    try:
        yield
    except GithubTokenRejected:
        raise errors.GithubTokenRejected(RELINK_MESSAGE) from None
    except GithubNotFound as exc:
        raise (not_found or errors.GithubFailed(str(exc))) from None
    except GithubTransientError as exc:
        wait = math.ceil(exc.retry_after) if exc.retry_after is not None else None
        extra: dict[str, Any] = {} if wait is None else {"retryAfterSeconds": wait}
        raise errors.GithubUnavailable(
            str(exc), headers={"Retry-After": str(wait or 30)}, **extra
        ) from None
    except GithubPermanentError as exc:
        raise errors.GithubFailed(str(exc)) from None
