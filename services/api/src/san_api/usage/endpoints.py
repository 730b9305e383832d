"""`GET /me/usage`: the caller's AI usage per UTC day and job type, from the ledger."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Query

from san_api.deps import CurrentUser, SessionDep
from san_api.errors import ValidationFailed
from san_api.openapi import problems
from san_api.usage.schemas import UsageDay, UsageReport, UsageTotals
from san_common.usage import ledger

router = APIRouter(tags=["me"])

MAX_DAYS = 366
DEFAULT_DAYS = 30


@router.get(
    "/me/usage",
    response_model=UsageReport,
    response_model_by_alias=True,
    responses=problems(ValidationFailed),
)
async def get_usage(
    user: CurrentUser,
    session: SessionDep,
    from_: Annotated[
        datetime.date | None,
        Query(alias="from", description="First UTC day (default: 29 days before `to`)"),
    ] = None,
    to: Annotated[datetime.date | None, Query(description="Last UTC day (default: today)")] = None,
) -> UsageReport:
    """Your AI usage per UTC day and job type, `from` and `to` included (at most 366 days)."""
    last = to or datetime.datetime.now(datetime.UTC).date()
    first = from_ or last - datetime.timedelta(days=DEFAULT_DAYS - 1)
    if first > last:
        raise ValidationFailed("`from` must not be after `to`")
    if (last - first).days >= MAX_DAYS:
        raise ValidationFailed(f"at most {MAX_DAYS} days at once")
    start = datetime.datetime.combine(first, datetime.time(), datetime.UTC)
    end = datetime.datetime.combine(
        last + datetime.timedelta(days=1), datetime.time(), datetime.UTC
    )
    rows = await ledger.per_day(session, user.user_id, start, end)
    total = ledger.Totals(
        sum(r.totals.prompt_tokens for r in rows),
        sum(r.totals.completion_tokens for r in rows),
        sum(r.totals.embedding_tokens for r in rows),
        sum((r.totals.cost_usd for r in rows), Decimal(0)),
    )
    return UsageReport.model_validate(
        {
            "from": first,
            "to": last,
            "days": [
                UsageDay(
                    date=r.day,
                    jobType=r.job_type,
                    jobs=r.jobs,
                    **UsageTotals.of(r.totals).model_dump(),
                )
                for r in rows
            ],
            "total": UsageTotals.of(total),
        }
    )
