"""Error classification (database connection loss, lost deadlocks) and the client-facing
summary."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc

from san_common.errors import (
    PermanentJobError,
    Stage,
    TransientJobError,
    is_connection_loss,
    is_contention,
    summarize,
)


def _dbapi(orig: BaseException, *, invalidated: bool = False) -> sa_exc.DBAPIError:
    return sa_exc.DBAPIError("SELECT 1", {}, orig, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle"),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.AdminShutdownError(
            "terminating connection due to administrator command"
        ),
        _dbapi(Exception("the database system is shutting down")),
        _dbapi(Exception("anything"), invalidated=True),
        sa_exc.OperationalError("SELECT 1", {}, Exception("server closed the connection")),
        sa_exc.InterfaceError("SELECT 1", {}, Exception("connection is closed")),
        sa_exc.TimeoutError("QueuePool limit of size 10 overflow 10 reached"),
        ConnectionResetError("Connection reset by peer"),
        OSError("[Errno 111] Connect call failed"),
    ],
)
def test_every_form_of_connection_loss_is_recognised(error: BaseException) -> None:
    assert is_connection_loss(error)


def test_a_wrapped_loss_is_found_through_the_cause_chain() -> None:
    try:
        try:
            raise asyncpg.exceptions.AdminShutdownError("terminating connection")
        except Exception as inner:
            raise RuntimeError("store failed") from inner
    except RuntimeError as outer:
        assert is_connection_loss(outer)


@pytest.mark.parametrize(
    "error",
    [
        sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key value")),
        _dbapi(Exception('relation "nope" does not exist')),
        PermanentJobError("scrap was deleted"),
        ValueError("a bug"),
    ],
)
def test_query_errors_and_bugs_are_not_outages(error: BaseException) -> None:
    assert not is_connection_loss(error)


class _Upstream(TransientJobError):
    def __init__(self) -> None:
        super().__init__("AI server answered 503: <html>secret-host.internal /var/lib/x</html>")
        self.status = 503


@pytest.mark.parametrize(
    "error",
    [
        _dbapi(asyncpg.exceptions.DeadlockDetectedError("deadlock detected")),
        _dbapi(asyncpg.exceptions.SerializationError("could not serialize access")),
    ],
)
def test_a_lost_deadlock_is_contention_and_not_an_outage(error: BaseException) -> None:
    assert is_contention(error)
    assert not is_connection_loss(error)


def test_other_database_errors_are_not_contention() -> None:
    assert not is_contention(_dbapi(asyncpg.exceptions.UniqueViolationError("duplicate key")))
    assert not is_contention(_dbapi(asyncpg.exceptions.ConnectionDoesNotExistError("closed")))
    assert not is_contention(ValueError("not a database error"))


def test_the_summary_names_kind_status_and_stage_never_the_upstream_body() -> None:
    text = summarize(_Upstream(), Stage.CALL, retrying=True)
    assert text == "temporary failure during the external call (upstream status 503); will retry"
    assert "secret-host" not in text and "/var/lib" not in text


def test_summaries_of_other_failures() -> None:
    assert summarize(TimeoutError(), Stage.CALL) == "timed out during the external call"
    limited = TransientJobError("slow down", retry_after=3)
    assert summarize(limited, Stage.CALL).startswith("rate limited")
    assert summarize(PermanentJobError("x"), Stage.LOAD) == (
        "permanent failure during reading the job's data"
    )
    assert summarize(KeyError("k"), Stage.STORE) == "internal error during storing the result"
