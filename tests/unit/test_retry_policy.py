"""RetryPolicy.decide: every branch, as a pure function."""

from __future__ import annotations

import httpx
import pytest

from san_common.errors import PermanentJobError, TransientJobError
from san_common.retry import ROUND_BACKOFF, GiveUp, Retry, RetryPolicy

POLICY = RetryPolicy(max_tries=3, backoff_seconds=1.0, max_backoff_seconds=5.0)


def test_backoff_doubles_and_is_capped() -> None:
    assert [POLICY.backoff(n) for n in (1, 2, 3, 4, 10)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert POLICY.backoff(10_000) == 5.0  # no overflow


@pytest.mark.parametrize(
    "error",
    [
        TransientJobError("AI server answered 503"),
        httpx.ReadTimeout("slow"),
        httpx.ConnectError("refused"),
        TimeoutError(),
        ConnectionResetError("reset by peer"),
    ],
)
def test_transient_errors_are_retried_until_the_last_try(error: BaseException) -> None:
    assert POLICY.decide(error, 1) == Retry(1.0)
    assert POLICY.decide(error, 2) == Retry(2.0)
    assert POLICY.decide(error, 3) == GiveUp("gave up after 3 tries")


@pytest.mark.parametrize("error", [PermanentJobError("bad data"), ValueError("a bug")])
def test_permanent_and_unknown_errors_give_up_at_once(error: BaseException) -> None:
    assert POLICY.decide(error, 1) == GiveUp()


def test_a_rate_limit_wait_does_not_spend_a_try() -> None:
    limited = TransientJobError("rate limited", retry_after=42.0)
    assert POLICY.decide(limited, 3) == Retry(42.0, spends_try=False)


def test_a_rate_limit_wait_beyond_the_bound_gives_up() -> None:
    limited = TransientJobError("rate limited", retry_after=3600.0)
    decision = POLICY.decide(limited, 1)
    assert isinstance(decision, GiveUp) and "more than the 900s" in decision.reason


def test_rate_limit_waits_are_bounded_then_spend_tries() -> None:
    limited = TransientJobError("rate limited", retry_after=1.0)
    assert POLICY.decide(limited, 1, waits=5) == Retry(1.0)  # an ordinary retry now
    assert POLICY.decide(limited, 3, waits=5) == GiveUp("gave up after 3 tries")


def test_round_backoff_never_gives_up_whatever_the_error() -> None:
    for attempt in (1, 2, 50, 10_000):
        decision = ROUND_BACKOFF.decide(PermanentJobError("x"), attempt)
        assert isinstance(decision, Retry) and 0.5 <= decision.after <= 30.0
    assert ROUND_BACKOFF.decide(RuntimeError("relay round"), 100) == Retry(30.0)


def test_unlimited_tries() -> None:
    assert RetryPolicy(max_tries=0).decide(TimeoutError(), 1_000) == Retry(300.0)
