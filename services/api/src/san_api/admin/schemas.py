"""Wire models of the admin API (camelCase, like the rest of the API)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from san_common.jobs.types import JobStatus, JobType


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdminJob(Wire):
    jobId: uuid.UUID
    jobType: str
    status: str
    targetId: uuid.UUID
    userId: uuid.UUID
    user: str | None = Field(description="the owner's external id (the token's `sub`)")
    attempt: int
    errorMessage: str | None = Field(description="the full cause chain (operators only)")
    createdAt: datetime
    updatedAt: datetime
    startedAt: datetime | None
    finishedAt: datetime | None
    workerId: str | None
    leaseExpiresAt: datetime | None
    tries: int = Field(description="tries so far (a retry waiting is PENDING with nextAttemptAt)")
    nextAttemptAt: datetime | None
    lastError: str | None = Field(description="the latest try's error (full, redacted)")
    errorSummary: str | None = Field(description="what the owner sees")


class TryView(Wire):
    tryNo: int
    workerId: str | None
    startedAt: datetime
    finishedAt: datetime | None
    outcome: str | None = Field(description="null while the try runs")
    error: str | None


class JobPage(Wire):
    items: list[AdminJob]
    nextCursor: str | None


class JobEventView(Wire):
    id: int
    status: str
    at: datetime


class TargetRow(Wire):
    table: str
    exists: bool
    status: str | None


class JobDetail(Wire):
    job: AdminJob
    events: list[JobEventView] = Field(description="every status change, oldest first")
    tries: list[TryView] = Field(description="each try: worker, times, outcome, error")
    target: TargetRow
    related: list[AdminJob] = Field(description="other jobs of the same target, newest first")


class JobFilterIn(Wire):
    jobId: str | None = Field(
        default=None,
        min_length=1,
        max_length=36,
        pattern=r"^[0-9a-fA-F-]+$",
        description="the job id, or the start of it (hex digits; dashes optional)",
    )
    status: list[JobStatus] = Field(default_factory=list, max_length=10)
    type: list[JobType] = Field(default_factory=list, max_length=10)
    user: str | None = Field(default=None, min_length=1, max_length=255)
    createdFrom: datetime | None = None
    createdTo: datetime | None = None
    finishedFrom: datetime | None = None
    finishedTo: datetime | None = None
    error: str | None = Field(default=None, min_length=1, max_length=200)


class JobListQuery(JobFilterIn):
    cursor: str | None = Field(default=None, max_length=200)
    limit: int = Field(default=50, ge=1, le=200)


class BulkIn(Wire):
    action: Literal["retry", "cancel"]
    filter: JobFilterIn = Field(default_factory=JobFilterIn)


_SUPERSEDED = (
    "FAILED jobs a retry skips: a newer job of the same target and type exists (active, "
    "completed, or failed in turn), so the work is done or under way already"
)
_SKIPPED = "jobs skipped, by reason"


class BulkPreview(Wire):
    action: str
    count: int = Field(description="jobs the action would retry or cancel")
    superseded: int = Field(default=0, description=_SUPERSEDED)
    skipped: dict[str, int] = Field(default_factory=dict, description=_SKIPPED)
    limit: int


class BulkResult(Wire):
    action: str
    count: int = Field(description="jobs retried or cancelled")
    matched: int = Field(description="jobs the filter matched before the action")
    superseded: int = Field(default=0, description=_SUPERSEDED)
    skipped: dict[str, int] = Field(default_factory=dict, description=_SKIPPED)
    auditId: int


class CountCell(Wire):
    jobType: str
    status: str
    count: int


class BucketCell(CountCell):
    at: datetime


class Stats(Wire):
    totals: list[CountCell]
    buckets: list[BucketCell]
    bucket: str
    since: datetime


class WorkerView(Wire):
    workerId: str
    host: str
    pid: int
    jobTypes: list[str] = Field(description="the job types it consumes")
    inFlight: int = Field(description="PROCESSING jobs it holds now")
    running: dict[str, int] = Field(description="those jobs, by job type")
    startedAt: datetime
    lastHeartbeatAt: datetime
    silentSeconds: float = Field(description="since its last beat")
    beatSeconds: float = Field(description="how often it beats")
    alive: bool = Field(description="false once it has missed three beats: dead or cut off")


class WorkersView(Wire):
    items: list[WorkerView]
    alive: int


class TimingView(Wire):
    jobType: str
    finished: int = Field(description="jobs of this type finished (COMPLETED or FAILED)")
    waitP50: float | None = Field(description="seconds from created to the first try's start")
    waitP95: float | None
    runP50: float | None = Field(description="seconds of the last try, start to end")
    runP95: float | None


class PendingView(Wire):
    queue: str
    jobTypes: list[str]
    pending: int = Field(description="PENDING jobs, those waiting for a retry's time included")
    due: int = Field(description="PENDING jobs due now")
    oldestDueSeconds: float | None = Field(
        description="how long the longest-waiting due job has been due (created, or its"
        " retry's time): a job nobody picks up shows here, not only as a count"
    )


class TimingsView(Wire):
    minutes: int
    since: datetime
    jobTypes: list[TimingView]
    queues: list[PendingView]


class OutboxView(Wire):
    unpublished: int
    oldestAgeSeconds: float | None


class QueueView(Wire):
    name: str
    jobType: str | None
    messages: int
    consumers: int
    unacked: int | None = Field(description="null when only passive declares are available")
    paused: bool


class QueuesView(Wire):
    source: Literal["management", "passive"]
    queues: list[QueueView]


class DeadLetterView(Wire):
    messageId: str | None = Field(
        description="the message's id, else `sha256:` and the start of its body's digest"
    )
    jobId: str | None
    jobType: str | None = Field(description="from the body, else from the queue it came from")
    reason: str | None = Field(
        description="a worker's (unreadable, version, unroutable, foreign, unknown-job) or"
        " RabbitMQ's (rejected, expired, delivery_limit, maxlen)"
    )
    detail: str | None = Field(description="the worker's explanation, if a worker said why")
    deadLetteredBy: Literal["worker", "broker"] | None
    queue: str | None = Field(description="the queue it was dead-lettered from")
    deaths: int = Field(description="how often RabbitMQ dead-lettered it (x-death)")
    deadLetteredAt: datetime | None
    deployment: str | None = Field(description="the deployment whose relay published it")
    jobStatus: str | None
    jobError: str | None = Field(description="the job's recorded error, if its job is known")
    body: str = Field(description="the message body (first 2,000 characters)")


class DeadLettersView(Wire):
    total: int
    items: list[DeadLetterView]


class DeadLetterAction(Wire):
    messageId: str | None = Field(default=None, min_length=1, max_length=200)
    jobType: JobType | None = None
    all: bool = False


class DeadLetterOutcome(Wire):
    messageId: str | None
    jobId: str | None
    jobType: str | None
    result: Literal["redriven", "not-redrivable", "failed", "purged"]
    reason: str | None = Field(description="why it was not re-driven")


class DeadLetterResult(Wire):
    action: str
    count: int = Field(description="dead letters re-driven, or purged")
    notRedrivable: int = 0
    failed: int = 0
    items: list[DeadLetterOutcome] = Field(
        description="each selected dead letter and what became of it (empty for purge all)"
    )
    auditId: int


class PauseView(Wire):
    jobType: str
    pausedBy: str
    pausedAt: datetime


class JobTypeView(Wire):
    jobType: str
    paused: bool
    pausedBy: str | None
    pausedAt: datetime | None


class SweepRunView(Wire):
    id: int
    sweep: str
    trigger: str
    status: str
    startedAt: datetime
    finishedAt: datetime
    batches: int
    totals: dict[str, Any]
    error: str | None


class SweepRequestView(Wire):
    id: int
    sweeps: list[str]
    requestedBy: str
    requestedAt: datetime
    startedAt: datetime | None
    finishedAt: datetime | None
    ok: bool | None
    # Times a recovery process took it: above 1 when one died (or shut down) mid-run.
    attempts: int = 0
    error: str | None = None


class SweepsView(Wire):
    runs: list[SweepRunView]
    requests: list[SweepRequestView]


class SweepRunIn(Wire):
    sweeps: list[str] = Field(min_length=1, max_length=10)


class AuditView(Wire):
    id: int
    at: datetime
    actor: str
    action: str
    target: str | None
    filter: dict[str, Any] | None
    count: int
    detail: dict[str, Any] | None


class AuditPage(Wire):
    items: list[AuditView]
    nextCursor: int | None
