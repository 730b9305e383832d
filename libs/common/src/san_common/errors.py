"""Error classes shared by workers, and the cause chain written to `error_message`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TypeVar

_T = TypeVar("_T")

_SECRET_PATTERNS = [
    re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{10,}|github_pat_[A-Za-z0-9_]{10,})"),
    re.compile(r"(?i)(bearer|token)\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?i)(api[_-]?key|access_token|client_secret)=([^&\s]+)"),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
]
# Every pattern's match holds one of these (in the lower-cased text), so a text holding
# none is spared the patterns: most log lines, at a few µs each (docs/hot-paths.md).
_SECRET_HINTS = ("gh", "github_pat_", "bearer", "token", "=", "sk-")
MAX_ERROR_MESSAGE = 4000


class JobFailure(Exception):
    """Base of failures a handler raises on purpose. `checkpoint`, when set, is a partial
    result (a JSON object) the runtime keeps for the job's next try (`job.checkpoint`)."""

    checkpoint: dict[str, object] | None = None
    # For the owner's summary (`summarize`): the upstream HTTP status and which call, if any.
    status: int | None = None
    call: str | None = None


class PermanentJobError(JobFailure):
    """Retrying cannot help (bad data, 4xx, revoked credentials): fail the job now.

    `public_reason`, when set, is the kind of failure its owner may read (`summarize`)."""

    public_reason: str | None = None


class TransientJobError(JobFailure):
    """May succeed later (timeout, 5xx, 429, reset): the runtime retries with backoff.

    `retry_after` (seconds), when the remote side said how long to wait, overrides backoff.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SystemWait(TransientJobError):
    """A wait the system itself imposes until a known time (an upstream's quota, a user's
    budget): however long, spending no try. The job waits PENDING with `waiting_for` set
    (`WAITING_FOR`), shown to its owner and left out of the scaling signal
    (docs/operations.md, "Waiting jobs")."""

    unbounded_wait = True
    waiting_for = ""  # one of WAITING_FOR, set by each subclass

    def __init__(self, message: str, *, retry_after: float, key: str | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.key = key  # what it waits for (an upstream quota's key), when there is one


# What a PENDING job may wait for (`async_jobs.waiting_for`, `GET /async-jobs/{id}`
# `waitingFor`): an upstream's quota, its user's budget (both until a known time), or its
# user's turn to be admitted into its queue (fair share: the relay holds its message).
WAITING_FOR = ("upstream-quota", "budget", "fair-share")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[REDACTED]")
    folded = text.lower()
    if not any(hint in folded for hint in _SECRET_HINTS):
        return text
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


# -- database connection loss -------------------------------------------------------------

# SQLSTATEs that mean "this connection (or the server) is going away", not "your query is
# wrong": class 08 (connection exception), 57P01 admin shutdown (pg_terminate_backend, fast
# shutdown), 57P02 crash shutdown, 57P03 cannot connect now (starting up / shutting down).
_CONNECTION_SQLSTATES = ("57P01", "57P02", "57P03")
_CONNECTION_PHRASES = (
    "shutting down",
    "connection is closed",
    "connection was closed",
    "terminating connection",
    "the database system is starting up",
    "connection refused",
    "connection reset",
)


def is_connection_loss(exc: BaseException) -> bool:
    """True when `exc` (raised by a database call) means the connection or the server went
    away: asyncpg's ConnectionDoesNotExistError / CannotConnectNowError /
    AdminShutdownError, "the database system is shutting down", SQLAlchemy's DBAPIError with
    `connection_invalidated`, OperationalError / InterfaceError, pool timeouts, and OSError
    from the driver. Follows causes, since SQLAlchemy wraps the driver's exception.

    Call it only for exceptions out of a database call: the same OSError from a handler's
    HTTP call is that call's failure, not an outage (the executor classifies by where)."""
    from sqlalchemy import exc as sa_exc

    for current in _database_causes(exc):
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(
            current,
            sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError | OSError,
        ):
            return True
        sqlstate = _sqlstate(current)
        if sqlstate is not None and (
            sqlstate.startswith("08") or sqlstate in _CONNECTION_SQLSTATES
        ):
            return True
        if type(current).__module__.startswith("asyncpg") and type(current).__name__ in (
            "ConnectionDoesNotExistError",
            "CannotConnectNowError",
            "AdminShutdownError",
            "CrashShutdownError",
            "ConnectionFailureError",
            "InterfaceError",
            "InternalClientError",
        ):
            return True
        text = str(current).lower()
        if any(phrase in text for phrase in _CONNECTION_PHRASES):
            return True
    return False


# SQLSTATEs of a transaction that lost to a concurrent one: 40P01 deadlock detected (two
# transactions locked the same rows in opposite orders; PostgreSQL rolled one back), 40001
# serialization failure. Nothing of it committed; the same work run again may succeed.
_CONTENTION_SQLSTATES = ("40P01", "40001")


def is_contention(exc: BaseException) -> bool:
    """True when `exc` (raised by a database call) means its transaction lost a deadlock
    or a serialization conflict to another transaction."""
    return any(_sqlstate(current) in _CONTENTION_SQLSTATES for current in _database_causes(exc))


def _sqlstate(exc: BaseException) -> str | None:
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return sqlstate if isinstance(sqlstate, str) else None


def _database_causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it wraps: SQLAlchemy's `orig` (the driver's exception), else its
    cause or context."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        orig = getattr(current, "orig", None)
        current = (
            orig
            if isinstance(orig, BaseException) and id(orig) not in seen
            else current.__cause__ or current.__context__
        )


# -- what the job's owner sees --------------------------------------------------------------

MAX_ERROR_SUMMARY = 300


class Stage:
    """Where a try failed; part of the summary the job's owner sees."""

    LOAD = "reading the job's data"
    CALL = "the external call"
    STORE = "storing the result"
    WORKER = "the worker"


def summarize(exc: BaseException, stage: str, *, retrying: bool = False) -> str:
    """A short, sanitized account of a failed try for the job's owner (`error_summary`):
    what kind of failure, the upstream HTTP status and which call when known, where it
    happened — never the upstream's body, host names, paths or secrets (those stay in
    `error_message` and the logs, for operators)."""
    kind, status, call = _describe(exc)
    parts = [kind]
    if call:
        parts.append(f"during {call}")
    elif stage:
        parts.append(f"during {stage}")
    if status is not None:
        parts.append(f"(upstream status {status})")
    text = " ".join(parts)
    if retrying:
        text += "; will retry"
    return text[:MAX_ERROR_SUMMARY]


def _describe(exc: BaseException) -> tuple[str, int | None, str | None]:
    status = _find_attr(exc, "status", int) or _find_attr(exc, "status_code", int)
    call = _find_attr(exc, "call", str)
    if isinstance(exc, PermanentJobError):
        kind = _find_attr(exc, "public_reason", str) or "permanent failure"
    elif isinstance(exc, TransientJobError):
        kind = "rate limited" if exc.retry_after is not None else "temporary failure"
    elif isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower():
        kind = "timed out"
    elif isinstance(exc, OSError | ConnectionError):
        kind = "connection failed"
    else:
        kind = "internal error"
    return kind, status, call


def _find_attr(exc: BaseException, name: str, kind: type[_T]) -> _T | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        value = getattr(current, name, None)
        if isinstance(value, kind) and not isinstance(value, bool):
            return value
        current = current.__cause__ or current.__context__
    return None
