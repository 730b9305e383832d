"""Operators' "run now" requests outlive the recovery process that took them: the taker
beats a heartbeat while it runs one; a request whose heartbeat stopped (the process died,
or lost the database) is taken again by the next poll, and the earlier taker's writes are
fenced out by the request's attempt count. A run cut short by shutdown gives the request
back; one taken too often ends unrun, with the reason."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.registration import lock_user
from san_common.jobs.registry import TIL_USER_LOCK
from san_common.jobs.types import JobType
from san_common.models import SweepRequest, SweepRun
from san_recovery import repository
from san_recovery.policy import Policy
from san_recovery.runner import MAX_REQUEST_ATTEMPTS, run_requested
from tests.recovery.seed import Seed, ask_for_sweeps, sweep_request
from tests.waiting import eventually

Sessions = async_sessionmaker[AsyncSession]
POLICY = Policy(batch_size=10)
STALE = timedelta(seconds=60)


async def _started_long_ago(db: Sessions, request_id: int, attempts: int) -> None:
    """As a process that took it and then died left it: started, its last beat old."""
    async with db() as session, session.begin():
        await session.execute(
            update(SweepRequest)
            .where(SweepRequest.id == request_id)
            .values(
                started_at=text("now() - interval '10 minutes'"),
                heartbeat_at=text("now() - interval '5 minutes'"),
                attempts=attempts,
            )
        )


async def _runs_of(db: Sessions, request_id: int) -> list[str]:
    async with db() as session:
        runs = await session.scalars(
            select(SweepRun.sweep).where(SweepRun.request_id == request_id).order_by(SweepRun.id)
        )
        return list(runs)


async def test_a_request_whose_process_stopped_beating_is_run_again(db: Sessions) -> None:
    request_id = await ask_for_sweeps(db, ["ghost"])
    await _started_long_ago(db, request_id, attempts=1)

    assert await run_requested(db, policy=POLICY, stale_after=STALE) == request_id

    request = await sweep_request(db, request_id)
    assert (request.attempts, request.ok, request.error) == (2, True, None)
    assert request.finished_at is not None
    assert await _runs_of(db, request_id) == ["ghost"]


async def test_a_request_whose_process_beats_is_left_to_it(db: Sessions) -> None:
    request_id = await ask_for_sweeps(db, ["ghost"])
    async with db() as session, session.begin():  # taken a moment ago by another replica
        assert (await repository.claim_request(session, stale_after=STALE)) is not None

    assert await run_requested(db, policy=POLICY, stale_after=STALE) is None

    request = await sweep_request(db, request_id)
    assert (request.attempts, request.finished_at) == (1, None)
    assert await _runs_of(db, request_id) == []


async def test_the_earlier_taker_is_fenced_out(db: Sessions) -> None:
    request_id = await ask_for_sweeps(db, ["ghost"])
    async with db() as session, session.begin():
        first = await repository.claim_request(session, stale_after=STALE)
    assert first is not None and first.attempts == 1
    await _started_long_ago(db, request_id, attempts=1)  # the first taker stalled
    async with db() as session, session.begin():
        second = await repository.claim_request(session, stale_after=STALE)
    assert second is not None and second.attempts == 2

    async with db() as session, session.begin():
        assert not await repository.beat_request(session, request_id, 1)
        assert not await repository.finish_request(session, request_id, 1, ok=False)
        assert not await repository.give_back_request(session, request_id, 1)
        assert await repository.finish_request(session, request_id, 2, ok=True)

    request = await sweep_request(db, request_id)
    assert (request.attempts, request.ok) == (2, True)


async def test_a_run_cut_short_by_shutdown_gives_the_request_back(db: Sessions) -> None:
    request_id = await ask_for_sweeps(db, ["ghost", "failed"])
    stop = asyncio.Event()
    stop.set()  # the process is shutting down as it takes the request

    assert await run_requested(db, policy=POLICY, stop=stop, stale_after=STALE) == request_id
    request = await sweep_request(db, request_id)
    assert (request.started_at, request.heartbeat_at, request.finished_at) == (None, None, None)
    assert request.attempts == 1  # a fencing token is never handed out twice

    # the next process runs it at once, without waiting for a stale heartbeat
    assert await run_requested(db, policy=POLICY, stale_after=STALE) == request_id
    request = await sweep_request(db, request_id)
    assert (request.attempts, request.ok) == (2, True)
    assert await _runs_of(db, request_id) == ["ghost", "failed"]


async def test_a_request_taken_too_often_ends_unrun_with_the_reason(db: Sessions) -> None:
    request_id = await ask_for_sweeps(db, ["ghost"])
    await _started_long_ago(db, request_id, attempts=MAX_REQUEST_ATTEMPTS)

    assert await run_requested(db, policy=POLICY, stale_after=STALE) == request_id

    request = await sweep_request(db, request_id)
    assert request.finished_at is not None and request.ok is False
    assert request.error == f"not run again: taken {MAX_REQUEST_ATTEMPTS} times, never finished"
    assert await _runs_of(db, request_id) == []
    assert await run_requested(db, policy=POLICY, stale_after=STALE) is None


async def test_a_run_longer_than_the_stale_bound_keeps_its_request(seed: Seed) -> None:
    """The run waits on a lock (a `POST /til` of the same user holds the TIL lock its
    re-registration needs) for longer than `stale_after`; its heartbeat keeps the request,
    so a second replica's poll leaves it alone."""
    # beats every 0.5 s: a fresh heartbeat is never near the bound, even on a loaded machine
    db, stale = seed.sessions, timedelta(seconds=2)
    user = await seed.user()
    summary = await seed.summary(user, seed.now.date() - timedelta(days=2), "FAILED")
    await seed.job(
        JobType.TIL_GENERATION, summary, user, status="FAILED", error="TIL_GENERATION failed: x"
    )
    request_id = await ask_for_sweeps(db, ["failed"])

    async with db() as holder, holder.begin():
        await lock_user(holder, TIL_USER_LOCK, user)
        running = asyncio.create_task(run_requested(db, policy=POLICY, stale_after=stale))

        async def beaten_past_the_bound() -> bool:
            request = await sweep_request(db, request_id)
            if request.started_at is None or request.heartbeat_at is None:
                return False
            return request.heartbeat_at - request.started_at > stale * 2

        await eventually(beaten_past_the_bound, within=30, what="heartbeats past the bound")
        assert await run_requested(db, policy=POLICY, stale_after=stale) is None
        assert not running.done()
    assert await asyncio.wait_for(running, 30) == request_id

    request = await sweep_request(db, request_id)
    assert (request.attempts, request.ok) == (1, True)
    assert await _runs_of(db, request_id) == ["failed"]
