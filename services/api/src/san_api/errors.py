"""Domain errors and their problem+json rendering (docs/reference/job-rules.md §6).

Each error class carries its stable `code`, HTTP status and default message; services raise
them, and one set of handlers renders every error — including FastAPI's own — the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import asyncpg
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class DatabaseConnectionLost(ConnectionError):
    """A statement failed on a connection that closed under it, whatever the error said
    (asyncpg can report a connection the server dropped as an internal client error)."""


class NoConnectionInTime(TimeoutError):
    """No connection of the API's asyncpg pool within `API_DATABASE_TIMEOUT_SECONDS`: every
    one busy, or a new one could not connect."""


# Connection-level failures of PostgreSQL: the database is down, restarting or full. Any
# other database error (a constraint, bad SQL) is a bug or a domain error, not an outage.
_DB_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseConnectionLost,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin shutdown, cannot connect now
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.TooManyConnectionsError,
    sqlalchemy.exc.TimeoutError,  # no pooled connection came free in time
)
_DB_CLIENT_MODULES = ("asyncpg", "sqlalchemy")

PROBLEM_JSON = "application/problem+json"
# A hostile body can hold thousands of invalid fields; the answer stays small.
MAX_REPORTED_ERRORS = 20


class AppError(Exception):
    code = "INTERNAL_ERROR"
    status = 500
    title = "Internal error"
    # True: the request's writes so far are committed before the error is answered (the
    # session dependency reads it); False, the default: the request writes nothing.
    keep_writes = False

    def __init__(
        self, detail: str | None = None, *, headers: Mapping[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.headers = dict(headers or {})
        self.extra = extra


class ValidationFailed(AppError):
    code, status, title = "VALIDATION_ERROR", 400, "The request is not valid"


class Unauthorized(AppError):
    code, status, title = "UNAUTHORIZED", 401, "A valid bearer token is required"


class Forbidden(AppError):
    code, status, title = "FORBIDDEN", 403, "This needs the operator role"


class Conflict(AppError):
    code, status, title = "CONFLICT", 409, "The resource is not in a state that allows this"


class BrokerUnavailable(AppError):
    code, status, title = "BROKER_UNAVAILABLE", 503, "RabbitMQ is unavailable; retry later"


class NotFound(AppError):
    code, status, title = "NOT_FOUND", 404, "Not found"


class DuplicateResource(AppError):
    code, status, title = "DUPLICATE_RESOURCE", 409, "The resource already exists or is in progress"


class ContentTooLarge(AppError):
    code, status, title = "CONTENT_TOO_LARGE", 413, "The content is too large"


class RateLimited(AppError):
    code, status, title = "RATE_LIMITED", 429, "Too many requests; retry after the given time"


class NotCancellable(AppError):
    code, status, title = (
        "NOT_CANCELLABLE",
        409,
        "This job is running and cannot be stopped safely; it will complete",
    )


class BudgetExceeded(AppError):
    code, status, title = (
        "BUDGET_EXCEEDED",
        429,
        "Your AI budget is spent; retry after it resets (`resetsAt`)",
    )


class TooManyActiveJobs(AppError):
    code, status, title = (
        "TOO_MANY_ACTIVE_JOBS",
        429,
        "Too many of your jobs are still pending or running; retry when some have finished",
    )


class TooManyStreams(AppError):
    code, status, title = (
        "TOO_MANY_STREAMS",
        429,
        "Too many of your event streams are open; close one or retry later",
    )


class StreamsBusy(AppError):
    code, status, title = (
        "STREAMS_BUSY",
        503,
        "This server holds as many event streams as it may; retry later",
    )


class DateInFuture(AppError):
    code, status, title = "DATE_IN_FUTURE", 400, "The date is after today in the user's time zone"


class NoCardsForDate(AppError):
    code, status, title = "NO_CARDS_FOR_DATE", 422, "The user has no knowledge cards on that date"


class TilNotCompleted(AppError):
    code, status, title = "TIL_NOT_COMPLETED", 400, "The TIL has not been generated yet"


# -- GitHub (docs/reference/job-rules.md §3.3, §4)
# ------------------------------------------------------------------


class GithubNotLinked(AppError):
    code, status, title = "GITHUB_NOT_LINKED", 400, "No GitHub account is linked"


class RepositoryNotConnected(AppError):
    code, status, title = "REPOSITORY_NOT_CONNECTED", 400, "No GitHub repository is connected"


class MultipleRepositories(AppError):
    code, status, title = (
        "MULTIPLE_REPOSITORIES",
        400,
        "More than one GitHub repository is connected; keep exactly one",
    )


class GithubTokenRejected(AppError):
    code, status, title = "GITHUB_TOKEN_REJECTED", 400, "GitHub rejected the access token"


class GithubRepositoryNotFound(AppError):
    code, status, title = (
        "GITHUB_REPOSITORY_NOT_FOUND",
        400,
        "The repository does not exist on GitHub or the token cannot see it",
    )


class RepositoryNotWritable(AppError):
    code, status, title = "REPOSITORY_NOT_WRITABLE", 400, "The token may not push to the repository"


class FilePathUnavailable(AppError):
    code, status, title = "FILE_PATH_UNAVAILABLE", 409, "No free file name is left for this TIL"


class OAuthStateInvalid(AppError):
    code, status, title = (
        "OAUTH_STATE_INVALID",
        400,
        "The OAuth state is missing, unknown, expired or already used",
    )


class OAuthStateNotYours(AppError):
    """Raised after the state was burnt: that write must survive the error (`keep_writes`)."""

    code, status, title = (
        "OAUTH_STATE_NOT_YOURS",
        403,
        "The OAuth authorization was started by another account",
    )
    keep_writes = True


class OAuthCodeRejected(AppError):
    code, status, title = "OAUTH_CODE_REJECTED", 400, "GitHub did not accept the authorization"


class OAuthNotConfigured(AppError):
    code, status, title = (
        "OAUTH_NOT_CONFIGURED",
        503,
        "The GitHub OAuth app is not configured (GITHUB_CLIENT_ID, GITHUB_CLIENT_SECRET)",
    )


class GithubUnavailable(AppError):
    code, status, title = (
        "GITHUB_UNAVAILABLE",
        503,
        "GitHub is unavailable or rate-limiting; retry later",
    )


class GithubFailed(AppError):
    code, status, title = "GITHUB_ERROR", 502, "GitHub answered unexpectedly"


_STATUS_CODES = {
    # Starlette raises 400 for bodies it cannot parse (bad UTF-8, too deep); same class of error
    400: "VALIDATION_ERROR",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    408: "REQUEST_TIMEOUT",
    413: "CONTENT_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}


# One title per status, whichever layer refused (the body limit middleware or a route).
_STATUS_TITLES = {
    400: ValidationFailed.title,
    408: "The request took too long to arrive",
    413: ContentTooLarge.title,
}


def database_unavailable(exc: BaseException) -> str | None:
    """The user-facing reason when `exc` means PostgreSQL cannot be reached, else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _DB_CONNECTION_ERRORS):
            return "The database is unavailable; retry later"
        if isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated:
            return "The database connection was lost; retry later"
        # what asyncpg raises for a connection that died while pooled (SQLAlchemy's asyncpg
        # dialect recognizes it by the same words); seen outside SQLAlchemy by the request's
        # transaction on the asyncpg pool
        if isinstance(current, asyncpg.InterfaceError) and "connection is closed" in str(current):
            return "The database connection was lost; retry later"
        # API_DATABASE_TIMEOUT_SECONDS ran out on a connect or a statement (a partition)
        if isinstance(current, NoConnectionInTime) or (
            isinstance(current, TimeoutError) and _raised_in_db_client(current)
        ):
            return "The database did not answer in time; retry later"
        if isinstance(current, OSError) and _raised_in_db_client(current):
            return "The database is unavailable; retry later"
        current = current.__cause__ or current.__context__
    return None


def _raised_in_db_client(exc: BaseException) -> bool:
    """An OSError (refused, no socket file, reset) raised while connecting to PostgreSQL."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.split(".")[0] in _DB_CLIENT_MODULES:
            return True
        tb = tb.tb_next
    return False


def problem(
    request: Request,
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {
        "type": f"https://san.example/problems/{code.lower().replace('_', '-')}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        "instance": request.url.path,
        **extra,
    }
    response_headers = dict(headers or {})
    if status == 401:
        response_headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=response_headers)


def _describe(errors: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]]]:
    items: list[dict[str, str]] = []
    for error in errors:
        loc = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        items.append({"field": loc, "message": str(error.get("msg", "invalid"))})
    detail = "; ".join(f"{i['field']}: {i['message']}" for i in items[:5])
    items = items[:MAX_REPORTED_ERRORS]
    return detail, items


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AppError)
    async def _app_error(request: Request, exc: AppError) -> JSONResponse:
        return problem(
            request, exc.status, exc.code, exc.title, exc.detail, headers=exc.headers, **exc.extra
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        items: list[dict[str, str]] = []
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = "The request body is not valid JSON"
        else:
            detail, items = _describe(errors)
        return problem(
            request, 400, "VALIDATION_ERROR", "The request is not valid", detail, errors=items
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "HTTP_ERROR")
        title = _STATUS_TITLES.get(exc.status_code, str(exc.detail))
        # keep the exception's headers, e.g. the `Allow` a 405 must carry (RFC 9110)
        return problem(request, exc.status_code, code, title, str(exc.detail), headers=exc.headers)

    # No handler for Exception here: Starlette runs that one in its outermost layer and then
    # re-raises, which makes uvicorn drop the keep-alive connection. Unexpected errors and a
    # lost database are answered by san_api.edge.EdgeMiddleware instead.
