"""Error classes shared by workers, and the cause chain written to `error_message`."""

from __future__ import annotations

import re

_SECRET_PATTERNS = [
    re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{10,}|github_pat_[A-Za-z0-9_]{10,})"),
    re.compile(r"(?i)(bearer|token)\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?i)(api[_-]?key|access_token|client_secret)=([^&\s]+)"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
]
MAX_ERROR_MESSAGE = 4000


class JobFailure(Exception):
    """Base of failures a handler raises on purpose."""


class PermanentJobError(JobFailure):
    """Retrying cannot help (bad data, 4xx, revoked credentials): fail the job now."""


class TransientJobError(JobFailure):
    """May succeed later (timeout, 5xx, 429, reset): the runtime retries with backoff.

    `retry_after` (seconds), when the remote side said how long to wait, overrides backoff.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[REDACTED]")
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub("[REDACTED]", text)
    return text


def cause_chain(exc: BaseException, secrets: tuple[str, ...] = ()) -> str:
    """`outer: cause: root cause`, following `raise … from …` and implicit contexts."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).strip() or type(current).__name__
        if not parts or parts[-1] != text:
            parts.append(text)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    return redact(": ".join(parts), secrets)[:MAX_ERROR_MESSAGE]
