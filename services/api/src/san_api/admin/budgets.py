"""An operator's AI budget for one user (`PUT /admin/api/users/{userId}/budget`), audited in
the same transaction (docs/operations.md, "AI usage, prices and budgets")."""

from __future__ import annotations

import uuid
from decimal import Decimal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from san_api.admin import repository
from san_api.admin.auth import CurrentOperator, get_operator
from san_api.deps import SessionDep, SettingsDep
from san_api.errors import Forbidden, NotFound, ValidationFailed
from san_api.openapi import problems
from san_common.models import User
from san_common.usage import budgets

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
