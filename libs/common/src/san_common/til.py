"""Starting TIL and recall-quiz generation (docs/reference/job-rules.md §3.2, §3.4), without any
transport.

The API (`POST /til`, `POST /recall-quizzes`) and the recovery service's daily TIL batch
both call these, inside a transaction they own; nothing here commits.

Serialization of `start_til_generation`: a transaction-scoped advisory lock per **user**
(`pg_advisory_xact_lock`). A `SELECT … FOR UPDATE` on `daily_summaries` cannot lock a row
that does not exist yet, and `INSERT … ON CONFLICT` locks only one (user, date) row, so two
requests for *different* dates could both pass the "no active TIL_GENERATION job for this
user" check. The per-user lock covers the check, the first insert and the registration; it
is released by the commit or rollback, and the next waiter's statements (READ COMMITTED)
see what the previous holder committed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs.registration import (
    Priority,
    TransactionRequired,
    lock_user,
    register_job_in_transaction,
)
from san_common.jobs.registry import TIL_USER_LOCK
from san_common.jobs.types import ACTIVE_STATUSES, JobType
from san_common.models import AsyncJob, DailySummary, RecallQuizGeneration, User

QUIZ_TYPES: Final = ("OX", "SHORT_ANSWER")


class TilInProgress(Exception):
    """The user already has an active (PENDING or PROCESSING) TIL_GENERATION job."""

    def __init__(self, job_id: uuid.UUID) -> None:
        super().__init__(f"a TIL is already being generated for this user (job {job_id})")
        self.job_id = job_id


class InvalidQuizTypes(ValueError):
    """Quiz types must be a non-empty list of distinct known types."""


@dataclass(frozen=True)
class TilStarted:
    summary_id: uuid.UUID
    job_id: uuid.UUID


@dataclass(frozen=True)
class QuizStarted:
    generation_id: uuid.UUID
    job_id: uuid.UUID


async def start_til_generation(
    session: AsyncSession,
    *,
    user_id: uuid.UUID,
    target_date: date,
    priority: Priority = Priority.INTERACTIVE,
) -> TilStarted:
    """Create or reuse the user's `daily_summaries` row for `target_date`, reset it to
    PENDING and register TIL_GENERATION, all in the caller's open transaction.

    A COMPLETED TIL may be regenerated: its document stays readable until the new job
    completes and replaces it. Raises `TilInProgress` when the user has any active
    TIL_GENERATION job, `TransactionRequired` outside a transaction, and lets
    `DuplicateActiveJob` through (the caller's transaction must then roll back).
    """
    _require_transaction(session, "start_til_generation")
    await lock_user_tils(session, user_id)
    active = await session.scalar(
        select(AsyncJob.job_id)
        .where(
            AsyncJob.user_id == user_id,
            AsyncJob.job_type == JobType.TIL_GENERATION.value,
            AsyncJob.status.in_([s.value for s in ACTIVE_STATUSES]),
        )
        .limit(1)
    )
    if active is not None:
        raise TilInProgress(active)

    upsert = insert(DailySummary).values(user_id=user_id, target_date=target_date)
    summary_id = await session.scalar(
        upsert.on_conflict_do_update(
            index_elements=["user_id", "target_date"],
            set_={"status": "PENDING", "error_message": None, "updated_at": func.now()},
        ).returning(DailySummary.id)
    )
    assert summary_id is not None  # DO UPDATE always returns the row
    job = await register_job_in_transaction(
        session,
        job_type=JobType.TIL_GENERATION,
        target_id=summary_id,
        user_id=user_id,
        priority=priority,
    )
    return TilStarted(summary_id, job.job_id)


async def lock_user_tils(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Wait for, then hold until the end of the caller's transaction, the user's TIL lock.

    `register_job_in_transaction` takes it for every TIL_GENERATION registration (the
    registry declares it), so a recovery re-registration waits for a running `POST /til`.
    """
    await lock_user(session, TIL_USER_LOCK, user_id)


async def start_quiz_generation(
    session: AsyncSession,
    *,
    user_id: uuid.UUID,
    target_date: date,
    quiz_types: Sequence[str],
    priority: Priority = Priority.INTERACTIVE,
) -> QuizStarted:
    """Insert a `recall_quiz_generations` row and register RECALL_QUIZ_GENERATION in the
    caller's open transaction. Each call is a new generation (no per-date uniqueness)."""
    _require_transaction(session, "start_quiz_generation")
    types = check_quiz_types(quiz_types)
    generation_id = await session.scalar(
        insert(RecallQuizGeneration)
        .values(user_id=user_id, target_date=target_date, quiz_types=list(types))
        .returning(RecallQuizGeneration.id)
    )
    assert generation_id is not None
    job = await register_job_in_transaction(
        session,
        job_type=JobType.RECALL_QUIZ_GENERATION,
        target_id=generation_id,
        user_id=user_id,
        priority=priority,
    )
    return QuizStarted(generation_id, job.job_id)


def check_quiz_types(quiz_types: Sequence[str]) -> tuple[str, ...]:
    types = tuple(quiz_types)
    if not types:
        raise InvalidQuizTypes("quiz types must not be empty")
    unknown = [t for t in types if t not in QUIZ_TYPES]
    if unknown:
        raise InvalidQuizTypes(f"unknown quiz types {unknown}; known: {', '.join(QUIZ_TYPES)}")
    if len(set(types)) != len(types):
        raise InvalidQuizTypes(f"quiz types must not repeat, got {list(types)}")
    return types


# -- the user's day ---------------------------------------------------------------------------


def zone_named(name: str | None) -> tzinfo:
    """The time zone called `name`; UTC when it is empty or unknown to the tz database."""
    if not name:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory, a long name
        return UTC


async def user_zone(session: AsyncSession, user_id: uuid.UUID) -> tzinfo:
    """The user's time zone setting (`users.timezone`), UTC by default."""
    return zone_named(await session.scalar(select(User.timezone).where(User.id == user_id)))


def day_window(zone: tzinfo, day: date) -> tuple[datetime, datetime]:
    """`[start, end)` of `day` in `zone`, in UTC. A card belongs to the day of its
    `created_at` in the user's zone; DST days are 23 or 25 hours long."""
    following = day + timedelta(days=1) if day < date.max else None
    return _midnight(day, zone), _midnight(following, zone)


def _midnight(day: date | None, zone: tzinfo) -> datetime:
    # The first and last representable days clamp instead of overflowing, so any date a
    # client can type yields a (possibly empty) window rather than an error.
    if day is None:
        return datetime.max.replace(tzinfo=UTC)
    try:
        return datetime.combine(day, time.min, tzinfo=zone).astimezone(UTC)
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def local_today(zone: tzinfo, now: datetime | None = None) -> date:
    return (now or datetime.now(UTC)).astimezone(zone).date()


def _require_transaction(session: AsyncSession, what: str) -> None:
    # Without this, the first query would autobegin a transaction that nobody commits.
    if not session.in_transaction():
        raise TransactionRequired(f"{what} must run inside the caller's open transaction")
