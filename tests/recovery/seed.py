"""Seed rows with chosen timestamps, and read back what a sweep registered; operators'
"run now" requests, and the advisory-lock waits the tests hold a sweep at."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.types import JobType
from san_common.models import (
    AsyncJob,
    DailySummary,
    KnowledgeCard,
    OutboxMessage,
    RecallQuizGeneration,
    Scrap,
    SweepRequest,
    TilGithubCommit,
    User,
)

EMBEDDING = [1.0] + [0.0] * 1535


@dataclass
class Seed:
    sessions: async_sessionmaker[AsyncSession]
    now: datetime

    def ago(self, **delta: float) -> datetime:
        return self.now - timedelta(**delta)

    async def _add(self, row: object) -> None:
        async with self.sessions() as session, session.begin():
            session.add(row)

    async def user(self, timezone: str = "UTC") -> uuid.UUID:
        user = User(id=uuid.uuid4(), external_id=f"rec-{uuid.uuid4().hex}", timezone=timezone)
        await self._add(user)
        return user.id

    async def scrap(
        self, user_id: uuid.UUID, *, age: timedelta = timedelta(hours=1), refined: bool = False
    ) -> uuid.UUID:
        content = f"scrap {uuid.uuid4()}"
        at = self.now - age
        scrap = Scrap(
            id=uuid.uuid4(),
            user_id=user_id,
            content=content,
            content_hash=hashlib.sha256(content.encode()).hexdigest(),
            refined_content="refined" if refined else None,
            created_at=at,
            updated_at=at,
        )
        await self._add(scrap)
        return scrap.id

    async def card(
        self, user_id: uuid.UUID, *, scrap_id: uuid.UUID | None = None, at: datetime | None = None
    ) -> uuid.UUID:
        scrap_id = scrap_id or await self.scrap(user_id)
        card = KnowledgeCard(
            id=uuid.uuid4(),
            user_id=user_id,
            scrap_id=scrap_id,
            title="t",
            summary="s",
            embedding=EMBEDDING,
            created_at=at or self.now,
        )
        await self._add(card)
        return card.id

    async def job(
        self,
        job_type: JobType,
        target_id: uuid.UUID,
        user_id: uuid.UUID,
        *,
        status: str,
        attempt: int = 1,
        updated: datetime | None = None,
        started: datetime | None = None,
        lease_until: datetime | None = None,
        error: str | None = None,
    ) -> uuid.UUID:
        updated = updated or self.ago(hours=3)
        job = AsyncJob(
            job_id=uuid.uuid4(),
            job_type=job_type.value,
            target_id=target_id,
            user_id=user_id,
            status=status,
            attempt=attempt,
            error_message=error,
            created_at=min(updated, started or updated),
            updated_at=updated,
            started_at=started,
            worker_id="host:123:dead" if status == "PROCESSING" else None,
            lease_expires_at=lease_until,
        )
        await self._add(job)
        return job.job_id

    async def summary(self, user_id: uuid.UUID, day: date, status: str) -> uuid.UUID:
        row = DailySummary(id=uuid.uuid4(), user_id=user_id, target_date=day, status=status)
        await self._add(row)
        return row.id

    async def quiz_generation(self, user_id: uuid.UUID, day: date, status: str) -> uuid.UUID:
        row = RecallQuizGeneration(
            id=uuid.uuid4(),
            user_id=user_id,
            target_date=day,
            quiz_types=["OX", "SHORT_ANSWER"],
            status=status,
        )
        await self._add(row)
        return row.id

    async def commit(
        self, user_id: uuid.UUID, summary_id: uuid.UUID, content: str, status: str
    ) -> uuid.UUID:
        row = TilGithubCommit(
            id=uuid.uuid4(),
            user_id=user_id,
            summary_id=summary_id,
            repo_owner="o",
            repo_name="r",
            file_path=f"til/{uuid.uuid4().hex}.md",
            content=content,
            content_hash=hashlib.sha256(content.encode()).hexdigest(),
            status=status,
        )
        await self._add(row)
        return row.id

    # -- reading back ----------------------------------------------------------------------

    async def get(self, job_id: uuid.UUID) -> AsyncJob:
        async with self.sessions() as session:
            job = await session.get(AsyncJob, job_id)
        assert job is not None
        return job

    async def job_ids(self) -> set[uuid.UUID]:
        async with self.sessions() as session:
            return set(await session.scalars(select(AsyncJob.job_id)))

    async def registered_since(self, before: set[uuid.UUID]) -> set[tuple[str, uuid.UUID, int]]:
        """(job type, target, attempt) of every job not in `before`; checks that each is
        PENDING with exactly one outbox message announcing it."""
        async with self.sessions() as session:
            jobs = [j for j in await session.scalars(select(AsyncJob)) if j.job_id not in before]
            bodies = [m.body for m in await session.scalars(select(OutboxMessage))]
        earlier = {str(job_id) for job_id in before}
        announced = sorted(b["job_id"] for b in bodies if b["job_id"] not in earlier)
        assert announced == sorted(str(j.job_id) for j in jobs), "outbox does not match new jobs"
        for job in jobs:
            assert job.status == "PENDING"
            body = next(b for b in bodies if b["job_id"] == str(job.job_id))
            assert body["attempt"] == job.attempt and body["target_id"] == str(job.target_id)
        return {(j.job_type, j.target_id, j.attempt) for j in jobs}

    async def revived(self, job_ids: set[uuid.UUID]) -> set[tuple[str, uuid.UUID, int]]:
        """(job type, target, attempt) of each of `job_ids` that is PENDING again under its
        own id, announced by a new outbox message carrying its new attempt."""
        async with self.sessions() as session:
            jobs = [j for j in await session.scalars(select(AsyncJob)) if j.job_id in job_ids]
            bodies = [m.body for m in await session.scalars(select(OutboxMessage))]
        revived = set()
        for job in jobs:
            announced = [b for b in bodies if b["job_id"] == str(job.job_id)]
            if job.status == "PENDING" and any(b["attempt"] == job.attempt for b in announced):
                revived.add((job.job_type, job.target_id, job.attempt))
        return revived

    async def status_of(
        self,
        model: type[DailySummary] | type[RecallQuizGeneration] | type[TilGithubCommit],
        row_id: uuid.UUID,
    ) -> str:
        async with self.sessions() as session:
            status = await session.scalar(select(model.status).where(model.id == row_id))
        assert status is not None
        return status


def utcnow() -> datetime:
    return datetime.now(UTC)


async def ask_for_sweeps(
    sessions: async_sessionmaker[AsyncSession], sweeps: list[str], **columns: object
) -> int:
    """An operator's "run now" request, as the admin API writes it (`columns` to seed it
    in another state); its id."""
    async with sessions() as session, session.begin():
        request = SweepRequest(sweeps=sweeps, requested_by="tests", **columns)
        session.add(request)
        await session.flush()
        return request.id


async def sweep_request(
    sessions: async_sessionmaker[AsyncSession], request_id: int
) -> SweepRequest:
    async with sessions() as session:
        request = await session.get(SweepRequest, request_id)
        assert request is not None
        return request


async def waiting_for_an_advisory_lock(sessions: async_sessionmaker[AsyncSession]) -> bool:
    """Whether some transaction waits for an advisory lock (a sweep held at the TIL lock)."""
    async with sessions() as session:
        waiting = await session.scalar(
            text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        )
    return bool(waiting)
