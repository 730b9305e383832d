"""The daily TIL batch: one TIL and one recall-quiz generation per user and day with cards,
days taken in each user's time zone; a no-op when run again."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.types import JobType
from san_common.models import AsyncJob, DailySummary, RecallQuizGeneration
from san_recovery.policy import Policy
from san_recovery.runner import RunStatus, run_sweep
from san_recovery.sweeps import Sweep
from tests.recovery.seed import Seed

# 00:30Z on the 15th: the 15th in Seoul (09:30), still the 14th in Los Angeles (17:30 PDT).
NOW = datetime(2025, 3, 15, 0, 30, tzinfo=UTC)
MAR_13, MAR_14 = date(2025, 3, 13), date(2025, 3, 14)


def utc(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2025, 3, day, hour, minute, tzinfo=UTC)


async def tils(db: async_sessionmaker[AsyncSession]) -> dict[tuple[uuid.UUID, date], uuid.UUID]:
    async with db() as session:
        rows = await session.execute(
            select(DailySummary.user_id, DailySummary.target_date, DailySummary.id)
        )
    return {(u, d): i for u, d, i in rows}


async def quizzes(db: async_sessionmaker[AsyncSession]) -> dict[tuple[uuid.UUID, date], uuid.UUID]:
    async with db() as session:
        rows = await session.execute(select(RecallQuizGeneration))
        generations = list(rows.scalars())
    assert all(g.quiz_types == ["OX", "SHORT_ANSWER"] for g in generations)
    return {(g.user_id, g.target_date): g.id for g in generations}


async def test_daily_batch_creates_one_til_and_one_quiz_per_user_day_with_cards(
    db: async_sessionmaker[AsyncSession],
) -> None:
    seed = Seed(db, NOW)
    plain = await seed.user()
    await seed.card(plain, at=utc(14, 12))
    await seed.card(plain, at=utc(14, 13))
    seoul = await seed.user("Asia/Seoul")
    await seed.card(seoul, at=utc(14, 14, 30))  # 23:30 on the 14th in Seoul
    la_today = await seed.user("America/Los_Angeles")
    await seed.card(la_today, at=utc(14, 12))  # 05:00 on the 14th in LA: that day is not over
    la = await seed.user("America/Los_Angeles")
    await seed.card(la, at=utc(14, 6))  # 23:00 on the 13th in LA
    unknown_zone = await seed.user("Mars/Olympus_Mons")  # counts as UTC
    await seed.card(unknown_zone, at=utc(14, 10))
    covered = await seed.user()
    await seed.card(covered, at=utc(14, 9))
    await seed.summary(covered, MAR_14, "COMPLETED")
    await seed.quiz_generation(covered, MAR_14, "COMPLETED")
    til_only = await seed.user()
    await seed.card(til_only, at=utc(14, 9))
    await seed.summary(til_only, MAR_14, "COMPLETED")
    busy = await seed.user()  # a TIL of another day is being generated
    await seed.card(busy, at=utc(14, 9))
    busy_job = await seed.job(
        JobType.TIL_GENERATION,
        await seed.summary(busy, date(2025, 3, 10), "PENDING"),
        busy,
        status="PENDING",
        updated=utc(15, 0),
    )
    older = await seed.user()
    await seed.card(older, at=utc(13, 12))  # only the day before yesterday
    await seed.user()  # no cards at all
    tils_before, quizzes_before = await tils(db), await quizzes(db)
    jobs_before = await seed.job_ids()

    report = await run_sweep(db, Sweep.DAILY_TIL, now=NOW, policy=Policy())

    assert report.status == RunStatus.DONE and report.ok
    new_tils = {k: v for k, v in (await tils(db)).items() if k not in tils_before}
    new_quizzes = {k: v for k, v in (await quizzes(db)).items() if k not in quizzes_before}
    assert set(new_tils) == {(plain, MAR_14), (seoul, MAR_14), (la, MAR_13), (unknown_zone, MAR_14)}
    assert set(new_quizzes) == set(new_tils) | {(til_only, MAR_14), (busy, MAR_14)}
    assert await seed.registered_since(jobs_before) == {
        *((JobType.TIL_GENERATION.value, i, 1) for i in new_tils.values()),
        *((JobType.RECALL_QUIZ_GENERATION.value, i, 1) for i in new_quizzes.values()),
    }
    til_counts = report.tally.by_type[JobType.TIL_GENERATION]
    assert (til_counts.found, til_counts.registered, til_counts.skipped) == (5, 4, 1)

    # Again: nothing new (the busy user's TIL is still waiting for its other job).
    jobs_before = await seed.job_ids()
    again = await run_sweep(db, Sweep.DAILY_TIL, now=NOW, policy=Policy())
    assert again.ok and again.tally.total.registered == 0
    assert await seed.job_ids() == jobs_before

    # A day later, looking two days back, the skipped day is caught up; so is the LA
    # user's 14th, which has ended by now. Nothing else is.
    async with db() as session, session.begin():
        for status in ("PROCESSING", "COMPLETED"):  # claimed, then done
            await session.execute(
                update(AsyncJob).where(AsyncJob.job_id == busy_job).values(status=status)
            )
    tils_before, quizzes_before = await tils(db), await quizzes(db)
    later = await run_sweep(
        db, Sweep.DAILY_TIL, now=NOW + timedelta(days=1), policy=Policy(til_lookback_days=2)
    )
    assert later.ok
    assert {k for k in await tils(db) if k not in tils_before} == {
        (busy, MAR_14),
        (la_today, MAR_14),
    }
    assert {k for k in await quizzes(db) if k not in quizzes_before} == {(la_today, MAR_14)}
