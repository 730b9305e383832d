"""An in-memory delivery and job store for driving the executor without any server."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from san_common.jobs.envelope import JobMessage
from san_common.jobs.lifecycle import JobState, TryOutcome
from san_common.models import AsyncJob
from san_common.usage import TryUsage
from san_common.worker.handler import JobHandler
from san_common.worker.store import Claim


@dataclass
class MemoryDelivery:
    body: bytes
    headers: Mapping[str, Any] = field(default_factory=dict)
    delivery_count: int = 0
    settled: list[str] = field(default_factory=list)
    dead_kind: str | None = None
    dead_reason: str | None = None

    async def ack(self) -> None:
        self.settled.append("ack")

    async def requeue(self) -> None:
        self.settled.append("requeue")

    async def dead_letter(self, kind: str, reason: str) -> None:
        self.settled.append("dead_letter")
        self.dead_kind, self.dead_reason = kind, reason


def delivery_for(job: AsyncJob, **changes: object) -> MemoryDelivery:
    envelope = JobMessage(
        message_id=uuid.uuid4(),
        job_id=job.job_id,
        job_type=job.job_type,
        target_id=job.target_id,
        user_id=job.user_id,
        attempt=job.attempt,
        created_at=datetime.now(UTC),
    )
    body = envelope.model_copy(update=changes).model_dump_json().encode()
    return MemoryDelivery(body)


def new_job(job_type: str = "CARD_ANALYSIS") -> AsyncJob:
    return AsyncJob(
        job_id=uuid.uuid4(),
        job_type=job_type,
        target_id=uuid.uuid4(),
        user_id=uuid.uuid4(),
        status="PENDING",
        attempt=1,
        tries=0,
    )


class Broken(Exception):
    """A scripted failure of one store call."""


@dataclass
class MemoryStore:
    """The JobStore contract over a dict; `fail_on` makes a method raise once."""

    jobs: dict[uuid.UUID, AsyncJob] = field(default_factory=dict)
    tries: list[tuple[uuid.UUID, int, str]] = field(default_factory=list)
    stored: list[Any] = field(default_factory=list)
    deferred: list[datetime] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)
    fail_on: dict[str, BaseException] = field(default_factory=dict)
    finish_result: bool = True
    spent: int = 0
    usage: list[TryUsage] = field(default_factory=list)

    def add(self, job: AsyncJob) -> AsyncJob:
        self.jobs[job.job_id] = job
        return job

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail_on:
            raise self.fail_on.pop(name)

    async def claim(
        self, job_id: uuid.UUID, worker_id: str, lease: timedelta, *, reclaim_own: bool
    ) -> Claim | JobState | None:
        self._maybe_fail("claim")
        job = self.jobs.get(job_id)
        now = datetime.now(UTC)
        if job is None:
            return None
        expired = job.lease_expires_at is not None and job.lease_expires_at < now
        due = job.next_attempt_at is None or job.next_attempt_at <= now
        if not (job.status == "PENDING" and due) and not (job.status == "PROCESSING" and expired):
            return JobState(job.status, job.lease_expires_at, job.next_attempt_at, now)
        job.status, job.worker_id, job.tries = "PROCESSING", worker_id, job.tries + 1
        job.lease_expires_at = now + lease
        return Claim(job, job.tries, self.spent, 0)

    async def load(self, claim: Claim, handler: JobHandler[Any, Any]) -> Any:
        self._maybe_fail("load")
        return await handler.load(None, claim.job)  # type: ignore[arg-type]

    async def finish(self, claim: Claim, handler: JobHandler[Any, Any], result: Any) -> bool:
        self._maybe_fail("finish")
        if not self.finish_result:
            return False
        await handler.store(None, claim.job, result)  # type: ignore[arg-type]
        self.stored.append(result)
        return self._settle(claim, "COMPLETED", TryOutcome.COMPLETED)

    async def fail(self, claim: Claim, message: str, summary: str) -> bool:
        self._maybe_fail("fail")
        claim.job.error_message, claim.job.error_summary = message, summary
        return self._settle(claim, "FAILED", TryOutcome.FAILED)

    async def retry(self, claim: Claim, **details: Any) -> datetime | None:
        self._maybe_fail("retry")
        self.retries.append(details)
        self._settle(claim, "PENDING", details["outcome"])
        claim.job.next_attempt_at = datetime.now(UTC) + timedelta(seconds=details["delay"])
        return claim.job.next_attempt_at

    async def release(self, claim: Claim, reason: str) -> bool:
        self._maybe_fail("release")
        return self._settle(claim, "PENDING", TryOutcome.RELEASED)

    async def extend(self, claim: Claim, lease: timedelta) -> bool:
        return claim.job.tries == claim.try_no

    async def defer(self, job_id: uuid.UUID, at: datetime) -> bool:
        self.deferred.append(at)
        return True

    async def record_usage(self, spent: TryUsage) -> None:
        self.usage.append(spent)

    def _settle(self, claim: Claim, status: str, outcome: TryOutcome) -> bool:
        job = claim.job
        if job.status != "PROCESSING" or job.tries != claim.try_no:
            return False
        job.status, job.lease_expires_at = status, None
        self.tries.append((job.job_id, claim.try_no, outcome.value))
        return True
