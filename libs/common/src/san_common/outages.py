"""A PostgreSQL outage, logged as one WARNING when it starts and one INFO when it ends.

Every loop of a service (the relay's rounds, the maintenance tasks, the worker's pause poll
and deliveries, the API's requests and listener) meets the same outage; each used to log
its own traceback every round, a dozen records for a few seconds of restart. They report
to one `Outage` per process instead (`DATABASE`): the first lost connection logs the
WARNING, the rest of the outage is DEBUG, and the first database call that *began after*
the outage started and succeeded logs the INFO. A call that began before cannot end it: it
may have finished just before the server went away.

Errors that are not a lost connection are not the outage's: `guard` logs them with their
traceback, as a bug should be.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

from san_common.errors import cause_chain, is_connection_loss

log = logging.getLogger("san_common.outages")


class Outage:
    def __init__(self, dependency: str) -> None:
        self._dependency = dependency
        self._since: float | None = None  # monotonic, while the outage lasts
        self._failures = 0

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def lost(self, error: BaseException, what: str) -> None:
        """A call to the dependency failed for want of a connection (`what` says which)."""
        self._failures += 1
        if self._since is None:
            self._since = time.monotonic()
            log.warning(
                "%s unreachable; retrying until it answers",
                self._dependency,
                extra={"fields": {"during": what, "error": cause_chain(error)[:500]}},
            )
        else:
            log.debug("%s still unreachable", self._dependency, extra={"fields": {"during": what}})

    def answered(self, began: float) -> None:
        """A call that began at `began` (monotonic) succeeded."""
        if self._since is None or began < self._since:
            return
        seconds = time.monotonic() - self._since
        log.info(
            "%s answers again",
            self._dependency,
            extra={"fields": {"down_s": round(seconds, 1), "failed_calls": self._failures}},
        )
        self._since, self._failures = None, 0

    @contextlib.asynccontextmanager
    async def guard(self, what: str) -> AsyncIterator[None]:
        """One round of a loop: a lost connection is the outage's, any other error is logged
        with its traceback as "`what` failed"; neither escapes (the loop's next round
        retries). A round that succeeds may end the outage."""
        began = time.monotonic()
        try:
            yield
        except Exception as exc:
            if is_connection_loss(exc):
                self.lost(exc, what)
            else:
                log.exception("%s failed", what)
        else:
            self.answered(began)


DATABASE = Outage("PostgreSQL")
# The broker, for the loops that only read it (queue depths); a publisher says more itself.
BROKER = Outage("RabbitMQ")
