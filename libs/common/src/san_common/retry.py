"""The retry decision, as a pure function of the error and the attempt number.

The executor applies the decision (schedule the next try through the outbox, or fail the
job); the relay's failed rounds and the worker's database-outage pauses use the same
policy for their backoff. Nothing here sleeps, reads the clock or draws random numbers,
so the unit tests pin every branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from san_common.errors import PermanentJobError, TransientJobError

# Failures of an external call that may go away by themselves. TimeoutError and
# ConnectionError are OSErrors: raised by a handler's call they are that call's failure,
# never a database outage (the executor only treats errors of its own database calls so).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    TransientJobError,
    httpx.TimeoutException,
    httpx.TransportError,
    TimeoutError,
    ConnectionError,
)


@dataclass(frozen=True)
class Retry:
    """Try again after `after` seconds. `spends_try` is False for waits the remote side
    asked for (rate limits): being paced is not failing."""

    after: float
    spends_try: bool = True


@dataclass(frozen=True)
class GiveUp:
    """Fail the job; `reason` (may be empty) prefixes the cause chain."""

    reason: str = ""


Decision = Retry | GiveUp


@dataclass(frozen=True)
class RetryPolicy:
    """`max_tries` tries in all (0 = unlimited), exponential backoff from `backoff_seconds`
    capped at `max_backoff_seconds`; a `retry_after` longer than `max_retry_after_seconds`,
    or more than `max_rate_limit_waits` of them, gives up. With `retry_everything`, every
    error is transient (the relay's rounds, database outages)."""

    max_tries: int = 3
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 300.0
    max_retry_after_seconds: float = 900.0
    max_rate_limit_waits: int = 5
    retry_everything: bool = False

    def backoff(self, attempt: int) -> float:
        """The pause after failed attempt `attempt` (1-based): base, 2×base, 4×base, …"""
        exponent = min(max(attempt, 1) - 1, 32)
        return float(min(self.max_backoff_seconds, self.backoff_seconds * 2**exponent))

    def decide(self, error: BaseException, attempt: int, *, waits: int = 0) -> Decision:
        """`attempt` is the number of the try that just failed (1 for the first), counting
        only tries that spend the budget; `waits` the rate-limit waits so far."""
        if isinstance(error, PermanentJobError) and not self.retry_everything:
            return GiveUp()
        retry_after = error.retry_after if isinstance(error, TransientJobError) else None
        if retry_after is not None and getattr(error, "unbounded_wait", False):
            # A wait the system itself imposes (a budget's reset): neither capped nor a try.
            return Retry(max(0.0, retry_after), spends_try=False)
        if retry_after is not None and waits < self.max_rate_limit_waits:
            if retry_after > self.max_retry_after_seconds:
                return GiveUp(
                    f"asked to wait {retry_after:.0f}s, more than the "
                    f"{self.max_retry_after_seconds:.0f}s a job may wait"
                )
            return Retry(max(0.0, retry_after), spends_try=False)
        if not (self.retry_everything or isinstance(error, TRANSIENT_ERRORS)):
            return GiveUp()
        if self.max_tries and attempt >= self.max_tries:
            return GiveUp(f"gave up after {attempt} tries")
        return Retry(self.backoff(attempt))


# Backoff of loops that must never give up: the relay's failed rounds, a worker's pause
# before requeueing a job a database outage interrupted.
ROUND_BACKOFF = RetryPolicy(
    max_tries=0, backoff_seconds=0.5, max_backoff_seconds=30.0, retry_everything=True
)
