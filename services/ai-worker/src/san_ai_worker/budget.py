"""The budget check before an AI job runs (docs/operations.md, "Budgets"): a job whose user
has no budget left for it never starts its calls, so it never half-runs. It waits for the
reset (no try spent) or fails with BUDGET_EXCEEDED, per `BUDGET_AT_RUN`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.errors import PermanentJobError, SystemWait
from san_common.models import AsyncJob
from san_common.usage import budgets

BUDGET_EXCEEDED = "BUDGET_EXCEEDED"


class BudgetWait(SystemWait):
    """Until the budget resets: however long that is, and spending no try."""

    waiting_for = "budget"


class BudgetGate:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        defaults: budgets.Limits,
        at_run: Literal["wait", "fail"],
    ) -> None:
        self._sessions = sessions
        self._defaults = defaults
        self._at_run = at_run

    async def __call__(self, job: AsyncJob) -> None:
        now = datetime.now(UTC)
        async with self._sessions() as session, session.begin():
            exceeded = await budgets.check(
                session, job.user_id, self._defaults, [job.job_type], now=now
            )
        if exceeded is None:
            return
        message = (
            f"{BUDGET_EXCEEDED}: {exceeded.message}; resets at {exceeded.resets_at:%Y-%m-%dT%H:%MZ}"
        )
        if self._at_run == "fail":
            raise PermanentJobError(message)
        raise BudgetWait(message, retry_after=exceeded.seconds_to_reset(now))
