"""The job-type registry: one `JobSpec` per job type, and everything that needs to know
about a job type reads it — registration (its uniqueness scope), the worker runtime (its
queue, retry policy, timeout, the mirrored status of its target row), the relay's lease
rescuer, recovery (target exists / already done / superseded, mirrored status), the
topology, the admin API's view of a job's target, and the tests that hold the deploy
manifests to it (KEDA triggers, tests/deploy).

Adding a job type = its `JobType` value, one `JobSpec` here, one handler module marked
`@handles(...)` in the worker service that consumes it, one endpoint (docs/architecture.md,
"Adding a job type"). There is no database list of job types: registration refuses a type
the registry does not hold, before anything is written. Tests add types of their own with
`register(...)` / `registered(...)`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

from sqlalchemy import ColumnElement, ColumnExpressionArgument, Table, exists, false, func, update
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.errors import MAX_ERROR_MESSAGE
from san_common.jobs.types import JobStatus, JobType
from san_common.models import (
    Base,
    DailySummary,
    KnowledgeCard,
    RecallQuizGeneration,
    Scrap,
    TilGithubCommit,
    User,
)
from san_common.retry import RetryPolicy

# The consuming services (docs/reference/job-rules.md §2.1): separate worker pools, so
# GitHub slowness never starves AI jobs.
AI_WORKER = "ai-worker"
GITHUB_WORKER = "github-worker"

# The advisory-lock namespace of "one active TIL_GENERATION job per user"
# (docs/reference/job-rules.md §3.2).
TIL_USER_LOCK = "san.til:"

# A condition on a job's target: given its id — a value, or a column to correlate with, as
# recovery's scrap sweeps do — a boolean SQL expression. One that reads the target's own
# table reads it through an alias, so that given that table's `id` column it still
# correlates (otherwise the subquery's table is the outer one and `id = id` always holds).
TargetId = uuid.UUID | ColumnExpressionArgument[uuid.UUID]
Predicate = Callable[[TargetId], ColumnElement[bool]]

_PENDING, _PROCESSING = JobStatus.PENDING.value, JobStatus.PROCESSING.value
_COMPLETED, _FAILED = JobStatus.COMPLETED.value, JobStatus.FAILED.value

# Which mirrored statuses may move to which (a COMPLETED target row stays COMPLETED unless
# the job completes again; recovery may reset a FAILED one to PENDING).
_MIRROR_FROM: dict[str, tuple[str, ...]] = {
    _PROCESSING: (_PENDING, _PROCESSING, _FAILED),
    _COMPLETED: (_PENDING, _PROCESSING, _FAILED, _COMPLETED),
    _FAILED: (_PENDING, _PROCESSING),
    _PENDING: (_PROCESSING, _FAILED),
}


@dataclass(frozen=True)
class Mirror:
    """A target table whose status column follows the status of the job that targets it."""

    table: Table
    status_column: str = "status"
    error_column: str | None = "error_message"

    async def set(
        self,
        session: AsyncSession,
        target_id: uuid.UUID,
        status: str,
        error: str | None = None,
    ) -> None:
        table = self.table
        values: dict[str, object] = {self.status_column: status, "updated_at": func.now()}
        if self.error_column is not None:
            values[self.error_column] = None if error is None else error[:MAX_ERROR_MESSAGE]
        await session.execute(
            update(table)
            .where(
                table.c.id == target_id,
                table.c[self.status_column].in_(_MIRROR_FROM[status]),
            )
            .values(**values)
        )

    def update_sql(self, status: str, jobs: str, job_type: str) -> str:
        """`set(…, status)` (no error) as one SQL statement over the target rows of the jobs
        of `job_type` in `jobs` (a relation with `job_type` and `target_id`): a WITH clause
        of the runtime's claim and completion statements, so the mirror moves in the same
        statement as its job."""
        table = self.table.name
        column = self.status_column
        sets = [f"{column} = '{status}'", "updated_at = now()"]
        if self.error_column is not None:
            sets.append(f"{self.error_column} = NULL")
        allowed = ", ".join(f"'{s}'" for s in _MIRROR_FROM[status])
        return (
            f"UPDATE {table} AS mirrored SET {', '.join(sets)} FROM {jobs} "
            f"WHERE {jobs}.job_type = '{job_type}' AND mirrored.id = {jobs}.target_id "
            f"AND mirrored.{column} IN ({allowed})"
        )


@dataclass(frozen=True)
class JobSpec:
    """What a job type is. Its uniqueness scope: one active job per (target, type) always
    (the partial unique index `uk_async_jobs_active_target_job_type`); with `user_lock`,
    also one per (user, type)."""

    job_type: str
    consumer: str  # the service whose worker runs it (AI_WORKER, GITHUB_WORKER, …)
    target: Table  # the table whose `id` a job's target_id names
    # The work the job stands for is already there: recovery does not re-run it.
    already_done: Predicate
    # The target row's status column follows the job's status (same table as `target`).
    mirror: Mirror | None = None
    # Another target took this one's place: recovery leaves the job FAILED, as done.
    superseded: Predicate | None = None
    # Registration takes this per-user advisory lock (transaction-scoped) before inserting.
    user_lock: str | None = None
    # None: the consuming worker's settings (WORKER_MAX_TRIES, WORKER_BACKOFF_SECONDS…).
    retry: RetryPolicy | None = None
    timeout_seconds: float = 600.0  # of `run`: a hung call becomes a transient failure
    # A running job of this type may be cancelled (its handler stopped). False where the
    # effect cannot be taken back once the call is sent and nothing records that it was.
    cancellable_while_running: bool = True

    def __post_init__(self) -> None:
        if self.mirror is not None and self.mirror.table is not self.target:
            raise ValueError(f"{self.job_type}: the mirror must be the target table")

    @property
    def queue(self) -> str:
        """The queue's name below the topology prefix (`{prefix}.jobs.<queue>`)."""
        return self.job_type.lower()

    def target_exists(self, target_id: uuid.UUID) -> ColumnElement[bool]:
        return exists().where(self.target.c.id == target_id)


class UnknownJobType(LookupError):
    def __init__(self, job_type: str) -> None:
        super().__init__(f"job type {job_type!r} is not in the registry")
        self.job_type = job_type


def _table(model: type[Base]) -> Table:
    return cast(Table, model.__table__)


_scraps = _table(Scrap)
_summaries = _table(DailySummary)
_generations = _table(RecallQuizGeneration)
_commits = _table(TilGithubCommit)


def _row_completed(table: Table) -> Predicate:
    row = table.alias(f"done_{table.name}")  # given `table.c.id` itself, still correct
    return lambda target_id: exists().where(row.c.id == target_id, row.c.status == _COMPLETED)


def _refined(scrap_id: TargetId) -> ColumnElement[bool]:
    scrap = _scraps.alias("refined")  # given `scraps.id` itself, still correct
    return exists().where(scrap.c.id == scrap_id, scrap.c.refined_content.is_not(None))


def _live_commit_of_the_same_content(commit_id: TargetId) -> ColumnElement[bool]:
    # A FAILED commit may not go back to PENDING while another commit of the same content
    # is live: the unique index `uk_til_github_commits_active_content` forbids it, and the
    # user's newer request is the one that counts.
    this, other = _commits.alias("this_commit"), _commits.alias("other_commit")
    return exists().where(
        this.c.id == commit_id,
        other.c.user_id == this.c.user_id,
        other.c.content_hash == this.c.content_hash,
        other.c.id != this.c.id,
        other.c.status.in_([_PENDING, _PROCESSING, _COMPLETED]),
    )


_BUILT_IN = (
    JobSpec(
        job_type=JobType.CARD_ANALYSIS,
        consumer=AI_WORKER,
        target=_scraps,
        already_done=lambda target_id: exists().where(KnowledgeCard.scrap_id == target_id),
    ),
    JobSpec(
        job_type=JobType.SCRAP_REFINE,
        consumer=AI_WORKER,
        target=_scraps,
        already_done=_refined,
    ),
    JobSpec(
        job_type=JobType.TIL_GENERATION,
        consumer=AI_WORKER,
        target=_summaries,
        already_done=_row_completed(_summaries),
        mirror=Mirror(_summaries),
        user_lock=TIL_USER_LOCK,
    ),
    JobSpec(
        job_type=JobType.RECALL_QUIZ_GENERATION,
        consumer=AI_WORKER,
        target=_generations,
        already_done=_row_completed(_generations),
        mirror=Mirror(_generations),
    ),
    JobSpec(
        job_type=JobType.GITHUB_STAR_RECOMMENDATION,
        consumer=AI_WORKER,
        target=_table(User),
        # Every run makes a new set of recommendations: never "already done".
        already_done=lambda target_id: false(),
    ),
    JobSpec(
        job_type=JobType.TIL_GITHUB_COMMIT,
        consumer=GITHUB_WORKER,
        target=_commits,
        already_done=_row_completed(_commits),
        mirror=Mirror(_commits),
        superseded=_live_commit_of_the_same_content,
        # The github-worker's own settings (WORKER_MAX_TRIES defaults to 5 there).
        retry=None,
        # Nothing records that the PUT was sent before it is: a running commit may have
        # made it already, so it is left to complete (docs/operations.md, "Cancelling").
        cancellable_while_running=False,
    ),
)

_REGISTRY: dict[str, JobSpec] = {str(spec.job_type): spec for spec in _BUILT_IN}


def spec_for(job_type: str) -> JobSpec:
    try:
        return _REGISTRY[str(job_type)]
    except KeyError:
        raise UnknownJobType(str(job_type)) from None


def find(job_type: str) -> JobSpec | None:
    return _REGISTRY.get(str(job_type))


def all_specs() -> list[JobSpec]:
    return list(_REGISTRY.values())


def job_types(consumer: str | None = None) -> list[str]:
    return [t for t, s in _REGISTRY.items() if consumer is None or s.consumer == consumer]


def mirrored() -> dict[str, Mirror]:
    return {t: s.mirror for t, s in _REGISTRY.items() if s.mirror is not None}


def cancellable_while_running() -> list[str]:
    """The job types a running job of which may be cancelled."""
    return sorted(t for t, s in _REGISTRY.items() if s.cancellable_while_running)


def register(spec: JobSpec) -> None:
    """Add a job type at start-up (before the topology is declared)."""
    if str(spec.job_type) in _REGISTRY:
        raise ValueError(f"job type {spec.job_type!r} is already registered")
    _REGISTRY[str(spec.job_type)] = spec


def unregister(job_type: str) -> None:
    _REGISTRY.pop(str(job_type), None)


@contextmanager
def registered(spec: JobSpec) -> Iterator[JobSpec]:
    """`register` for the duration of a block (tests)."""
    register(spec)
    try:
        yield spec
    finally:
        unregister(spec.job_type)
