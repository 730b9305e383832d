"""One candidate, one savepoint: a candidate that fails is rolled back alone and left for
the next run, so a single bad row can never block a sweep for good."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from san_recovery.tally import Outcome

log = logging.getLogger(__name__)


async def settle(
    session: AsyncSession,
    action: Callable[[], Awaitable[Outcome]],
    *,
    skip_on: tuple[type[Exception], ...] = (),
    **fields: object,
) -> Outcome:
    """Run `action` in a savepoint. `skip_on` exceptions mean "someone else did it"."""
    try:
        async with session.begin_nested():
            return await action()
    except skip_on:
        return Outcome.SKIPPED
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise  # the whole run is over; the runner reports it
        log.exception("recovery candidate failed; left for the next run", extra={"fields": fields})
        return Outcome.ERROR
