"""What holds jobs back (`GET /admin/api/scheduling`, the console's Scheduling page): each
upstream budget with the jobs waiting for its reset, and each user's share of each job
type's work (docs/operations.md, "Scheduling")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from san_api.admin import repository
from san_api.admin.auth import get_operator
from san_api.deps import SessionDep
from san_api.errors import Forbidden, ValidationFailed
from san_api.openapi import problems

router = APIRouter(prefix="/admin/api", tags=["admin"], dependencies=[Depends(get_operator)])


class UpstreamBudget(BaseModel):
    key: str = Field(description="`ai <base URL> <model>`, or `github <API URL> <token digest>`")
    requestsRemaining: int | None = Field(description="left in this window; null: not known")
    requestsLimit: int | None
    requestsResetAt: datetime | None = Field(description="null: no window running")
    tokensRemaining: int | None
    tokensLimit: int | None
    tokensResetAt: datetime | None
    inFlight: int = Field(description="calls sent and not answered yet")
    refused: int = Field(description="calls the budget refused so far (each one a job's wait)")
    jobsWaiting: int = Field(description="PENDING jobs waiting for this budget's reset")
    updatedAt: datetime


class UserShare(BaseModel):
    jobType: str
    userId: uuid.UUID
    user: str | None = Field(description="the user's external id")
    running: int
    pending: int = Field(description="PENDING jobs, those waiting included")
    waiting: int = Field(description="of them, waiting for a quota's or a budget's reset")
    awaitingAdmission: int = Field(
        description="of them, due and held in the outbox until the relay admits them into "
        "the queue by fair share"
    )
    share: float = Field(description="the user's part of the job type's running jobs, 0–1")
    weight: float | None = Field(
        description="the user's share weight (`users.share_weight`); null: no such user row"
    )


class Scheduling(BaseModel):
    budgets: list[UpstreamBudget] = Field(description="by key")
    shares: list[UserShare] = Field(description="by job type, then the busiest users first")
    sharesTruncated: bool = Field(description="more (job type, user) pairs than `limit`")


@router.get(
    "/scheduling", response_model=Scheduling, responses=problems(Forbidden, ValidationFailed)
)
async def scheduling(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="(job type, user) pairs")] = 200,
) -> Scheduling:
    """Upstream budgets (what is left, when it resets, the jobs waiting for it) and each
    user's share of each job type's active jobs."""
    budgets = await repository.upstream_budgets(session)
    shares = await repository.user_shares(session, limit=limit + 1)
    return Scheduling(
        budgets=[
            UpstreamBudget(
                key=b.key,
                requestsRemaining=b.requests_remaining,
                requestsLimit=b.requests_limit,
                requestsResetAt=b.requests_reset_at,
                tokensRemaining=b.tokens_remaining,
                tokensLimit=b.tokens_limit,
                tokensResetAt=b.tokens_reset_at,
                inFlight=b.in_flight,
                refused=b.refused,
                jobsWaiting=b.jobs_waiting,
                updatedAt=b.updated_at,
            )
            for b in budgets
        ],
        shares=[
            UserShare(
                jobType=s.job_type,
                userId=s.user_id,
                user=s.external_id,
                running=s.running,
                pending=s.pending,
                waiting=s.waiting,
                awaitingAdmission=s.awaiting_admission,
                weight=s.weight,
                share=s.running / s.running_of_type if s.running_of_type else 0.0,
            )
            for s in shares[:limit]
        ],
        sharesTruncated=len(shares) > limit,
    )
