"""An operator's AI budget for one user (`PUT /admin/api/users/{userId}/budget`), audited in
the same transaction, and everyone's AI spending (`GET /admin/api/usage`)
(docs/operations.md, "AI usage, prices and budgets")."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from san_api.admin import repository
from san_api.admin.auth import CurrentOperator, get_operator
from san_api.deps import SessionDep, SettingsDep
from san_api.errors import Forbidden, NotFound, ValidationFailed
from san_api.openapi import problems
from san_common.models import User
from san_common.usage import budgets, ledger

router = APIRouter(prefix="/admin/api", tags=["admin"], dependencies=[Depends(get_operator)])


class BudgetUpdate(BaseModel):
    tokensPerDay: int | None = Field(
        default=None, ge=0, le=10**15, description="null: the default; 0: unlimited"
    )
    usdPerMonth: Decimal | None = Field(
        default=None,
        ge=0,
        le=10**9,
        max_digits=14,
        decimal_places=4,
        description="null: the default; 0: unlimited",
    )


class BudgetView(BaseModel):
    userId: uuid.UUID
    tokensPerDay: int = Field(description="in effect; 0: unlimited")
    usdPerMonth: float = Field(description="in effect; 0: unlimited")


@router.put(
    "/users/{userId}/budget",
    response_model=BudgetView,
    responses=problems(Forbidden, NotFound, ValidationFailed),
)
async def set_budget(
    userId: uuid.UUID,
    body: BudgetUpdate,
    session: SessionDep,
    settings: SettingsDep,
    operator: CurrentOperator,
) -> BudgetView:
    """Set one user's AI budget (audited); a null limit keeps the setting's default."""
    if await session.get(User, userId) is None:
        raise NotFound(f"user {userId} not found")
    await budgets.set_override(
        session,
        userId,
        tokens_per_day=body.tokensPerDay,
        usd_per_month=body.usdPerMonth,
        actor=operator.name,
    )
    await repository.audit(
        session,
        actor=operator.name,
        action="user.budget",
        target=str(userId),
        count=1,
        detail={
            "tokensPerDay": body.tokensPerDay,
            "usdPerMonth": None if body.usdPerMonth is None else str(body.usdPerMonth),
        },
    )
    limits = await budgets.limits_for(session, userId, settings.default_budget())
    return BudgetView(
        userId=userId,
        tokensPerDay=limits.tokens_per_day,
        usdPerMonth=float(limits.usd_per_month),
    )


class SpendingView(BaseModel):
    tokens: int
    costUsd: float
    jobs: int = Field(description="jobs that made at least one AI call")


class DaySpending(SpendingView):
    day: datetime.date


class JobTypeSpending(SpendingView):
    jobType: str


class UserSpending(SpendingView):
    userId: uuid.UUID
    user: str | None = Field(description="the user's external id")


class UsageOverview(BaseModel):
    days: int
    since: datetime.date = Field(description="the first UTC day counted")
    perDay: list[DaySpending] = Field(description="oldest first; days without calls omitted")
    perJobType: list[JobTypeSpending] = Field(description="most expensive first")
    perUser: list[UserSpending] = Field(description="most expensive first")


MAX_DAYS = 366


@router.get("/usage", response_model=UsageOverview, responses=problems(Forbidden, ValidationFailed))
async def usage(
    session: SessionDep,
    days: Annotated[int, Query(ge=1, le=MAX_DAYS, description="UTC days, today included")] = 30,
) -> UsageOverview:
    """Everyone's AI tokens and cost from the ledger, per UTC day, per job type and per user."""
    since = datetime.datetime.now(datetime.UTC).date() - datetime.timedelta(days=days - 1)
    start = datetime.datetime.combine(since, datetime.time(), datetime.UTC)
    report = await ledger.spending(session, start)

    def totals(s: ledger.Spending) -> dict[str, object]:
        return {"tokens": s.tokens, "costUsd": float(s.cost_usd), "jobs": s.jobs}

    return UsageOverview(
        days=days,
        since=since,
        perDay=[DaySpending(day=s.key, **totals(s)) for s in report.per_day],
        perJobType=[JobTypeSpending(jobType=s.key, **totals(s)) for s in report.per_job_type],
        perUser=[
            UserSpending(userId=s.key, user=s.external_id, **totals(s)) for s in report.per_user
        ],
    )
