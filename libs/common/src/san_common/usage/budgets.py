"""Per-user AI budgets (docs/operations.md, "Budgets"): tokens per UTC day and US dollars
per UTC month. The defaults are settings (0 = unlimited); an operator's override per user
is a row of `user_budgets`, whose NULL limit keeps the default. The API checks at enqueue,
the AI worker again before it runs a job."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import ClassVar, Literal

from pydantic import Field

from san_common.settings import ServiceSettings
from san_common.usage import ledger
from san_common.usage.ledger import Connection

_LIMITS = "SELECT tokens_per_day, usd_per_month FROM user_budgets WHERE user_id = $1"

_SET = """
INSERT INTO user_budgets (user_id, tokens_per_day, usd_per_month, updated_at, updated_by)
VALUES ($1, $2, $3, now(), $4)
ON CONFLICT (user_id) DO UPDATE SET tokens_per_day = excluded.tokens_per_day,
    usd_per_month = excluded.usd_per_month, updated_at = now(), updated_by = excluded.updated_by
"""


class BudgetSettings(ServiceSettings):
    reported_prefixes: ClassVar[tuple[str, ...]] = ("BUDGET_",)

    budget_tokens_per_day: int = Field(
        default=0, ge=0, description="AI tokens a user may spend per UTC day; 0 = unlimited"
    )
    budget_usd_per_month: Decimal = Field(
        default=Decimal(0),
        ge=0,
        description="US dollars of AI calls (AI_PRICES) a user may spend per UTC month; "
        "0 = unlimited",
    )
    budget_at_run: Literal["wait", "fail"] = Field(
        default="wait",
        description="A job whose user is over budget when a worker takes it: wait for the "
        "reset, or fail with BUDGET_EXCEEDED",
    )

    def default_budget(self) -> Limits:
        return Limits(self.budget_tokens_per_day, self.budget_usd_per_month)


@dataclass(frozen=True)
class Limits:
    tokens_per_day: int  # 0: unlimited
    usd_per_month: Decimal  # 0: unlimited

    @property
    def unlimited(self) -> bool:
        return not self.tokens_per_day and not self.usd_per_month

    def overridden(self, tokens_per_day: int | None, usd_per_month: Decimal | None) -> Limits:
        """These defaults under a user's override (a `user_budgets` row; None keeps one)."""
        return Limits(
            self.tokens_per_day if tokens_per_day is None else int(tokens_per_day),
            self.usd_per_month if usd_per_month is None else Decimal(usd_per_month),
        )


@dataclass(frozen=True)
class Exceeded:
    """Why a user may not spend more now, and when that changes."""

    message: str
    resets_at: datetime

    def seconds_to_reset(self, now: datetime) -> int:
        return max(1, int((self.resets_at - now).total_seconds()) + 1)


@dataclass(frozen=True)
class Periods:
    day_start: datetime
    month_start: datetime
    day_reset: datetime
    month_reset: datetime

    @staticmethod
    def at(now: datetime) -> Periods:
        day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        month = day.replace(day=1)
        next_month = (month + timedelta(days=32)).replace(day=1)
        return Periods(day, month, day + timedelta(days=1), next_month)


async def limits_for(connection: Connection, user_id: uuid.UUID, defaults: Limits) -> Limits:
    rows = await ledger.fetch(connection, _LIMITS, user_id)
    if not rows:
        return defaults
    return defaults.overridden(rows[0]["tokens_per_day"], rows[0]["usd_per_month"])


async def check(
    connection: Connection,
    user_id: uuid.UUID,
    defaults: Limits,
    job_types: Sequence[str],
    *,
    now: datetime | None = None,
) -> Exceeded | None:
    """None when the user may start jobs of `job_types` now: what they spent plus what
    such jobs cost them on average stays within every limit."""
    limits = await limits_for(connection, user_id, defaults)
    return await check_limits(connection, user_id, limits, job_types, now=now)


async def check_limits(
    connection: Connection,
    user_id: uuid.UUID,
    limits: Limits,
    job_types: Sequence[str],
    *,
    now: datetime | None = None,
) -> Exceeded | None:
    """`check` against `limits` the caller has read already (the API reads them with the
    user's active-job count, in one round trip)."""
    if limits.unlimited:
        return None
    periods = Periods.at(now or datetime.now(UTC))
    spent = await ledger.spent(
        connection,
        user_id,
        day_start=periods.day_start,
        month_start=periods.month_start,
        job_types=job_types,
    )
    tokens = limits.tokens_per_day
    if tokens and (
        spent.tokens_today >= tokens or spent.tokens_today + spent.tokens_expected > tokens
    ):
        return Exceeded(
            f"AI budget exceeded: {spent.tokens_today} of {tokens} tokens spent today"
            + (f", and this needs about {spent.tokens_expected}" if spent.tokens_expected else ""),
            periods.day_reset,
        )
    usd = limits.usd_per_month
    if usd and (spent.usd_month >= usd or spent.usd_month + spent.usd_expected > usd):
        return Exceeded(
            f"AI budget exceeded: ${spent.usd_month:.4f} of ${usd:.2f} spent this month",
            periods.month_reset,
        )
    return None


async def set_override(
    connection: Connection,
    user_id: uuid.UUID,
    *,
    tokens_per_day: int | None,
    usd_per_month: Decimal | None,
    actor: str,
) -> None:
    """An operator's budget for one user (None: the default); the caller audits it."""
    await ledger.execute(connection, _SET, user_id, tokens_per_day, usd_per_month, actor)
