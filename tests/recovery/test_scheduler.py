"""The scheduler fires each plan at its cron times (UTC), driven by an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from san_recovery.scheduler import Plan, Scheduler
from san_recovery.sweeps import DAILY, PERIODIC, Sweep


async def test_each_plan_runs_at_its_cron_times() -> None:
    clock = [datetime(2025, 1, 1, 1, 59, 30, tzinfo=UTC)]
    runs: list[tuple[tuple[Sweep, ...], datetime]] = []
    stop = asyncio.Event()

    async def run(sweeps: Sequence[Sweep], now: datetime) -> None:
        runs.append((tuple(sweeps), now))
        clock[0] += timedelta(seconds=5)  # a run takes time
        if tuple(sweeps) == DAILY:
            stop.set()

    async def wait(stop_: asyncio.Event, seconds: float) -> bool:
        assert 0 < seconds <= 60  # naps are short, so a clock jump is noticed
        clock[0] += timedelta(seconds=seconds)
        return stop_.is_set()

    plans = [Plan("0 */2 * * *", PERIODIC), Plan("10 0 * * *", DAILY)]
    await asyncio.wait_for(Scheduler(plans, run, clock=lambda: clock[0], wait=wait).run(stop), 10)

    day = datetime(2025, 1, 1, tzinfo=UTC)
    expected = [(PERIODIC, day + timedelta(hours=h)) for h in range(2, 25, 2)]
    expected.append((DAILY, day + timedelta(days=1, minutes=10)))
    assert runs == expected
