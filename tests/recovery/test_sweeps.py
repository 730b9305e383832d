"""Each sweep on seeded rows (timestamps written relative to an injected `now`) registers
exactly the expected jobs, nothing else, and nothing at all when run again."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.types import JobType
from san_common.models import DailySummary, RecallQuizGeneration, TilGithubCommit
from san_recovery.policy import Policy
from san_recovery.runner import RunStatus, SweepReport, run_sweep
from san_recovery.sweeps import Sweep
from tests.recovery.seed import Seed

CA, SR = JobType.CARD_ANALYSIS, JobType.SCRAP_REFINE
POLICY = Policy()


async def sweep(seed: Seed, which: Sweep, policy: Policy = POLICY) -> SweepReport:
    report = await run_sweep(seed.sessions, which, now=seed.now, policy=policy)
    assert report.status == RunStatus.DONE, report.error
    return report


def counts(report: SweepReport) -> dict[str, tuple[int, int, int]]:
    """job type → (found, registered, given up)"""
    return {str(t): (c.found, c.registered, c.given_up) for t, c in report.tally.by_type.items()}


async def test_ghost_sweep_fails_and_reregisters_lost_and_dead_jobs(seed: Seed) -> None:
    user = await seed.user()
    s = [await seed.scrap(user) for _ in range(7)]
    lost = await seed.job(CA, s[0], user, status="PENDING", updated=seed.ago(minutes=31))
    young = await seed.job(SR, s[1], user, status="PENDING", updated=seed.ago(minutes=29))
    hung = await seed.job(
        CA, s[2], user, status="PROCESSING",
        started=seed.ago(minutes=61), lease_until=seed.ago(minutes=-4),
    )  # fmt: skip
    dead = await seed.job(
        SR, s[3], user, status="PROCESSING",
        started=seed.ago(minutes=5), lease_until=seed.ago(minutes=2),
    )  # fmt: skip
    just_expired = await seed.job(
        CA, s[4], user, status="PROCESSING",
        started=seed.ago(minutes=5), lease_until=seed.ago(seconds=10),
    )  # fmt: skip
    await seed.card(user, scrap_id=s[5])
    done = await seed.job(CA, s[5], user, status="PENDING", updated=seed.ago(hours=2))
    settled = await seed.job(CA, s[6], user, status="FAILED", updated=seed.ago(days=2))
    summary = await seed.summary(user, seed.now.date(), "PROCESSING")
    til = await seed.job(
        JobType.TIL_GENERATION, summary, user, status="PROCESSING",
        started=seed.ago(hours=2), lease_until=seed.ago(hours=1),
    )  # fmt: skip
    generation = await seed.quiz_generation(user, seed.now.date(), "PROCESSING")
    exhausted = await seed.job(
        JobType.RECALL_QUIZ_GENERATION, generation, user, status="PROCESSING", attempt=4,
        started=seed.ago(minutes=10), lease_until=seed.ago(minutes=5),
    )  # fmt: skip
    before = await seed.job_ids()

    report = await sweep(seed, Sweep.GHOST)

    # Ghosts keep their job ids (the ones their clients poll): no new job, the same rows
    # are claimable again with attempt 2.
    assert await seed.registered_since(before) == set()
    assert await seed.revived({lost, hung, dead, til}) == {
        (CA.value, s[0], 2),
        (CA.value, s[2], 2),
        (SR.value, s[3], 2),
        (JobType.TIL_GENERATION.value, summary, 2),
    }
    assert counts(report) == {
        "CARD_ANALYSIS": (3, 2, 1),
        "SCRAP_REFINE": (1, 1, 0),
        "TIL_GENERATION": (1, 1, 0),
        "RECALL_QUIZ_GENERATION": (1, 0, 1),
    }
    messages = {
        job_id: (await seed.get(job_id)).last_error or "" for job_id in (lost, hung, dead, til)
    }
    assert messages[lost] == "ghost job: pending for 31 min (message lost)"
    assert messages[hung].startswith(
        "ghost job: worker host:123:dead died or hangs (processing for 1 h 1 min"
    )
    assert messages[dead].startswith(
        "ghost job: worker host:123:dead died (lease expired 2 min ago"
    )
    for job_id in (lost, hung, dead, til):
        assert (await seed.get(job_id)).status == "PENDING"
    for job_id, status in ((young, "PENDING"), (just_expired, "PROCESSING"), (settled, "FAILED")):
        assert (await seed.get(job_id)).status == status
    gave_up = await seed.get(exhausted)
    assert gave_up.status == "FAILED"
    assert (gave_up.error_message or "").startswith(
        "recovery gave up after 4 attempts: ghost job: worker host:123:dead died"
    )
    assert (await seed.get(done)).error_message == (
        "recovery gave up (target already complete): ghost job: pending for 2 h (message lost)"
    )
    # the rows that mirror a job's status follow it: never stuck PROCESSING
    assert await seed.status_of(DailySummary, summary) == "PENDING"
    assert await seed.status_of(RecallQuizGeneration, generation) == "FAILED"
    # ... and its owner reads why recovery stopped, never the worker's (host) name
    async with seed.sessions() as session:
        shown = await session.scalar(
            select(RecallQuizGeneration.error_message).where(RecallQuizGeneration.id == generation)
        )
    assert shown == "recovery gave up after 4 attempts: its worker or its message was lost"

    before = await seed.job_ids()
    again = await sweep(seed, Sweep.GHOST)
    assert counts(again) == {}
    assert await seed.job_ids() == before


async def test_failed_sweep_retries_newest_failures_until_the_cap(seed: Seed) -> None:
    user = await seed.user()
    s = [await seed.scrap(user) for _ in range(4)]
    await seed.job(CA, s[0], user, status="FAILED", error="CARD_ANALYSIS failed: boom")
    capped = await seed.job(
        CA, s[1], user, status="FAILED", attempt=4, error="CARD_ANALYSIS failed: boom"
    )
    await seed.job(SR, s[2], user, status="FAILED", updated=seed.ago(hours=5))
    await seed.job(SR, s[2], user, status="COMPLETED", updated=seed.ago(hours=4))
    old = await seed.job(CA, s[3], user, status="FAILED", attempt=3, updated=seed.ago(hours=5))
    await seed.job(CA, s[3], user, status="FAILED", attempt=1, updated=seed.ago(hours=4))
    gone = await seed.job(CA, uuid.uuid4(), user, status="FAILED", error="CARD_ANALYSIS failed: x")
    summary = await seed.summary(user, seed.now.date(), "FAILED")
    await seed.job(JobType.TIL_GENERATION, summary, user, status="FAILED")
    superseded = await seed.commit(user, summary, "same content", "FAILED")
    await seed.commit(user, summary, "same content", "COMPLETED")
    await seed.job(JobType.TIL_GITHUB_COMMIT, superseded, user, status="FAILED", error="e")
    retried_commit = await seed.commit(user, summary, "other content", "FAILED")
    await seed.job(JobType.TIL_GITHUB_COMMIT, retried_commit, user, status="FAILED")
    await seed.job(JobType.GITHUB_STAR_RECOMMENDATION, user, user, status="FAILED")
    earlier = await seed.job(
        CA,
        await seed.scrap(user),
        user,
        status="FAILED",
        error="recovery gave up after 4 attempts: x",
    )
    before = await seed.job_ids()

    report = await sweep(seed, Sweep.FAILED)

    assert await seed.registered_since(before) == {
        (CA.value, s[0], 2),
        (CA.value, s[3], 2),  # the newest failure counts, not the older attempt 3
        (JobType.TIL_GENERATION.value, summary, 2),
        (JobType.TIL_GITHUB_COMMIT.value, retried_commit, 2),
        (JobType.GITHUB_STAR_RECOMMENDATION.value, user, 2),
    }
    assert counts(report) == {
        "CARD_ANALYSIS": (4, 2, 2),
        "TIL_GENERATION": (1, 1, 0),
        "TIL_GITHUB_COMMIT": (2, 1, 1),
        "GITHUB_STAR_RECOMMENDATION": (1, 1, 0),
    }
    assert (await seed.get(capped)).error_message == (
        "recovery gave up after 4 attempts: CARD_ANALYSIS failed: boom"
    )
    assert (await seed.get(gone)).error_message == (
        "recovery gave up (target no longer exists): CARD_ANALYSIS failed: x"
    )
    assert (await seed.get(old)).error_message is None  # superseded, left as it was
    assert (await seed.get(earlier)).error_message == "recovery gave up after 4 attempts: x"
    assert await seed.status_of(DailySummary, summary) == "PENDING"
    assert await seed.status_of(TilGithubCommit, retried_commit) == "PENDING"
    assert await seed.status_of(TilGithubCommit, superseded) == "FAILED"

    before = await seed.job_ids()
    again = await sweep(seed, Sweep.FAILED)
    assert counts(again) == {}  # given-up jobs are not found (nor counted) again
    assert await seed.job_ids() == before


@pytest.mark.parametrize(("which", "job_type"), [(Sweep.ORPHANS, CA), (Sweep.UNREFINED, SR)])
async def test_scrap_sweeps_register_missing_jobs(
    seed: Seed, which: Sweep, job_type: JobType
) -> None:
    user = await seed.user()
    orphan = await seed.scrap(user)
    await seed.scrap(user, age=timedelta(minutes=5))  # inside the grace period
    if job_type == CA:
        await seed.card(user)  # scrap with its card
    else:
        await seed.scrap(user, refined=True)
    active = await seed.scrap(user)
    await seed.job(job_type, active, user, status="PENDING", updated=seed.ago(minutes=1))
    failed = await seed.scrap(user)  # the failed sweep's business
    await seed.job(job_type, failed, user, status="FAILED")
    lost_result = await seed.scrap(user)  # completed, yet the result is gone
    await seed.job(job_type, lost_result, user, status="COMPLETED", attempt=2)
    exhausted = await seed.scrap(user)
    await seed.job(job_type, exhausted, user, status="COMPLETED", attempt=4)
    before = await seed.job_ids()

    report = await sweep(seed, which)

    assert await seed.registered_since(before) == {
        (job_type.value, orphan, 1),
        (job_type.value, lost_result, 3),
    }
    assert counts(report) == {job_type.value: (2, 2, 0)}
    before = await seed.job_ids()
    assert counts(await sweep(seed, which)) == {}
    assert await seed.job_ids() == before


@pytest.mark.parametrize(("which", "attempt"), [(Sweep.ORPHANS, 1), (Sweep.GHOST, 2)])
async def test_a_candidate_that_fails_is_left_for_the_next_run_and_the_rest_proceed(
    seed: Seed, db: async_sessionmaker[AsyncSession], which: Sweep, attempt: int
) -> None:
    user = await seed.user()
    # Candidates go in target order: the failing one comes first, the healthy one after it.
    poisoned, healthy = sorted([await seed.scrap(user), await seed.scrap(user)])
    if which == Sweep.GHOST:
        for scrap in (poisoned, healthy):
            await seed.job(CA, scrap, user, status="PENDING", updated=seed.ago(hours=1))
    async with db() as session, session.begin():
        # A real database error for one target only: a trigger refusing its new job (or,
        # for a ghost revived under its own id, the update of its row).
        await session.execute(
            text(
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF NEW.target_id = '{poisoned}' THEN RAISE EXCEPTION 'refused'; END IF; "
                "RETURN NEW; END $$"
            )
        )
        await session.execute(
            text(
                "CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON async_jobs "
                "FOR EACH ROW EXECUTE FUNCTION refuse()"
            )
        )
    before = await seed.job_ids()

    report = await run_sweep(db, which, now=seed.now, policy=POLICY)

    assert report.status == RunStatus.DONE and not report.ok
    assert counts(report) == {CA.value: (2, 1, 0)}
    assert report.tally.by_type[CA].errors == 1
    assert await handled_since(seed, which, before) == {(CA.value, healthy, attempt)}

    async with db() as session, session.begin():
        await session.execute(text("DROP TRIGGER refuse ON async_jobs"))
    before = await seed.job_ids()
    assert counts(await sweep(seed, which)) == {CA.value: (1, 1, 0)}
    assert await handled_since(seed, which, before) >= {(CA.value, poisoned, attempt)}


async def handled_since(
    seed: Seed, which: Sweep, before: set[uuid.UUID]
) -> set[tuple[str, uuid.UUID, int]]:
    """What the sweep registered: new jobs, or (ghosts) the same jobs revived."""
    if which == Sweep.GHOST:
        assert await seed.registered_since(before) == set()
        return await seed.revived(before)
    return await seed.registered_since(before)


async def test_a_sweep_another_run_holds_is_skipped_as_locked(
    seed: Seed, db: async_sessionmaker[AsyncSession]
) -> None:
    user = await seed.user()
    await seed.scrap(user)
    async with db() as holder, holder.begin():
        await holder.execute(
            text("SELECT pg_advisory_xact_lock(hashtextextended('san.recovery:orphans', 0))")
        )
        report = await run_sweep(db, Sweep.ORPHANS, now=seed.now, policy=POLICY)
    assert report.status == RunStatus.LOCKED and report.ok
    assert counts(report) == {}
    assert counts(await sweep(seed, Sweep.ORPHANS)) == {CA.value: (1, 1, 0)}


async def test_runs_in_batches_until_nothing_is_left(seed: Seed) -> None:
    user = await seed.user()
    scraps = {await seed.scrap(user) for _ in range(5)}
    before = await seed.job_ids()
    report = await sweep(seed, Sweep.ORPHANS, Policy(batch_size=2))
    assert report.batches == 3
    assert {target for _, target, _ in await seed.registered_since(before)} == scraps
