"""A user's own jobs: poll one (`GET /async-jobs/{jobId}`), list them with filters and
cursor pagination (`GET /async-jobs`), cancel an active one (`DELETE /async-jobs/{jobId}`).
Only the owner sees a job; anyone else gets 404."""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Set as AbstractSet
from datetime import UTC, datetime
from typing import Annotated, Literal, cast

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncSession

import san_common.jobs.repository as jobs
from san_api.deps import CurrentUser, SessionDep
from san_api.errors import Conflict, NotCancellable, NotFound, ValidationFailed
from san_api.jobs import cancelling, repository
from san_api.openapi import problems
from san_api.usage.schemas import UsageTotals
from san_common.jobs.types import JobStatus
from san_common.models import AsyncJob
from san_common.usage import ledger

router = APIRouter(tags=["jobs"])

# san_common.errors.WAITING_FOR, spelt out for the OpenAPI description
WaitingFor = Literal["upstream-quota", "budget", "fair-share"]


class JobView(BaseModel):
    jobId: uuid.UUID
    jobType: str
    status: str
    # Sanitized summaries (san_common.errors.summarize): why the job FAILED, and why its
    # latest try failed (also while a retry waits). The full cause chain is for operators
    # (logs, `async_jobs.error_message`), never for clients.
    errorMessage: str | None
    targetId: uuid.UUID
    attempt: int
    tries: int
    nextAttemptAt: datetime | None
    lastError: str | None
    createdAt: datetime
    updatedAt: datetime
    startedAt: datetime | None
    finishedAt: datetime | None
    usage: UsageTotals | None = Field(
        default=None,
        description="What the job's AI calls used, over all its tries (the job itself only)",
    )
    waitingFor: WaitingFor | None = Field(
        default=None,
        description=(
            "Why a PENDING job is not running yet: the AI or GitHub quota is spent "
            "(`upstream-quota`), your AI budget is spent (`budget`), or its queue admits other "
            "users' or more urgent work first and it waits for your turn (`fair-share`); null "
            "when it is not waiting for any of these. No try is spent while it waits."
        ),
    )
    availableAt: datetime | None = Field(
        default=None,
        description=(
            "When the wait ends (the quota's or budget's reset); null for `fair-share`, which "
            "ends when your turn comes"
        ),
    )


class JobPage(BaseModel):
    items: list[JobView] = Field(description="Newest first")
    nextCursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end"
    )


@router.get("/async-jobs", response_model=JobPage, responses=problems(ValidationFailed))
async def list_jobs(
    user: CurrentUser,
    session: SessionDep,
    status: Annotated[
        list[JobStatus] | None, Query(description="Only jobs in these statuses (repeatable)")
    ] = None,
    jobType: Annotated[
        list[Annotated[str, Field(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")]] | None,
        Query(description="Only jobs of these types (repeatable)", max_length=20),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=200, description="nextCursor of a page")] = None,
) -> JobPage:
    """The caller's own jobs, newest first, filtered by status and type."""
    rows = await repository.page(
        session,
        user.user_id,
        statuses=[s.value for s in status or ()],
        job_types=jobType or [],
        after=_decode_cursor(cursor) if cursor else None,
        limit=limit + 1,
    )
    more, rows = len(rows) > limit, rows[:limit]
    held = await _held(session, user.user_id, rows)
    return JobPage(
        items=[_view(row, held) for row in rows],
        nextCursor=_encode_cursor(rows[-1]) if more else None,
    )


@router.get("/async-jobs/{jobId}", response_model=JobView)
async def get_job(jobId: uuid.UUID, user: CurrentUser, session: SessionDep) -> JobView:
    """Poll a job. Only its owner sees it; anyone else gets 404."""
    job = await jobs.get_for_user(session, jobId, user.user_id)
    if job is None:
        raise NotFound(f"job {jobId} not found")
    view = _view(job, await _held(session, user.user_id, [job]))
    view.usage = UsageTotals.of(await ledger.of_job(session, jobId))
    return view


@router.delete(
    "/async-jobs/{jobId}",
    response_model=JobView,
    responses=problems(NotFound, Conflict, NotCancellable),
)
async def cancel_job(jobId: uuid.UUID, user: CurrentUser, session: SessionDep) -> JobView:
    """Cancel your own job while it is PENDING (including waiting for its next try) or
    PROCESSING: it becomes CANCELLED, terminal; a running one's worker stops its handler
    within about a second, and nothing it would have written is kept. A running GitHub
    commit answers 409 `NOT_CANCELLABLE` (its PUT may already be made; it completes); a
    job that is over answers 409 `CONFLICT`."""
    job = await jobs.get_for_user(session, jobId, user.user_id)
    if job is None:
        raise NotFound(f"job {jobId} not found")
    await cancelling.cancel(session, job, "cancelled by its owner", "cancelled by you")
    return _view(job)


def _encode_cursor(last: AsyncJob) -> str:
    text = f"{last.created_at.isoformat()}|{last.job_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, job_id = text.split("|")
        after = datetime.fromisoformat(created_at), uuid.UUID(job_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed("cursor is not one this API returned") from None
    if after[0].tzinfo is None:
        raise ValidationFailed("cursor is not one this API returned")
    return after


async def _held(session: AsyncSession, user_id: uuid.UUID, jobs: list[AsyncJob]) -> set[uuid.UUID]:
    """The PENDING jobs among `jobs` held back by their queue's fair-share window."""
    pending = [j.job_id for j in jobs if j.status == JobStatus.PENDING.value]
    return await repository.awaiting_admission(session, user_id, pending)


def _view(job: AsyncJob, held: AbstractSet[uuid.UUID] = frozenset()) -> JobView:
    waiting_for, available_at = waiting(job, datetime.now(UTC), held=job.job_id in held)
    return JobView(
        jobId=job.job_id,
        jobType=job.job_type,
        status=job.status,
        errorMessage=job.error_summary if job.status == JobStatus.FAILED.value else None,
        targetId=job.target_id,
        attempt=job.attempt,
        tries=job.tries,
        nextAttemptAt=job.next_attempt_at,
        lastError=job.error_summary,
        createdAt=job.created_at,
        updatedAt=job.updated_at,
        startedAt=job.started_at,
        finishedAt=job.finished_at,
        waitingFor=waiting_for,
        availableAt=available_at,
    )


def waiting(
    job: AsyncJob, now: datetime, *, held: bool = False
) -> tuple[WaitingFor | None, datetime | None]:
    """What a PENDING job waits for, and until when: a quota's or budget's wait lasts until
    its `next_attempt_at`; then the job is due, and `held` says whether its message waits
    for admission into its queue (fair share: until the user's turn comes, no time known)."""
    if job.status != JobStatus.PENDING.value:
        return None, None
    if job.waiting_for is not None and job.next_attempt_at is not None:
        if job.next_attempt_at > now:
            return cast(WaitingFor, job.waiting_for), job.next_attempt_at
    if held:
        return "fair-share", None
    return None, None
