"""The long-running mode: run the sweeps on their cron schedules until told to stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from croniter import croniter

from san_recovery.sweeps import Sweep

log = logging.getLogger(__name__)

# Sleep at most this long between clock readings, so a wall-clock jump (NTP, a suspended
# VM) delays a run by a minute at most.
_MAX_NAP_SECONDS = 60.0

Clock = Callable[[], datetime]
RunSweeps = Callable[[Sequence[Sweep], datetime], Awaitable[object]]
# Waits up to `seconds` for `stop`; True when it was set.
Wait = Callable[[asyncio.Event, float], Awaitable[bool]]


@dataclass(frozen=True)
class Plan:
    cron: str  # evaluated in UTC
    sweeps: tuple[Sweep, ...]

    def next_after(self, moment: datetime) -> datetime:
        fire: datetime = croniter(self.cron, moment.astimezone(UTC)).get_next(datetime)
        return fire


async def wait_for_stop(stop: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))
    except TimeoutError:
        return False
    return True


class Scheduler:
    def __init__(
        self,
        plans: Sequence[Plan],
        run: RunSweeps,
        *,
        clock: Clock = lambda: datetime.now(UTC),
        wait: Wait = wait_for_stop,
    ) -> None:
        self._plans = list(plans)
        self._run = run
        self._clock = clock
        self._wait = wait

    async def run(self, stop: asyncio.Event) -> None:
        """A run that is due starts when the previous one ended; fires missed meanwhile
        are dropped, never piled up (every sweep catches up on its own)."""
        now = self._clock()
        due = {i: plan.next_after(now) for i, plan in enumerate(self._plans)}
        for plan, at in zip(self._plans, due.values(), strict=True):
            names = [sweep.value for sweep in plan.sweeps]
            log.info(
                "sweeps scheduled: %s",
                ", ".join(names),
                extra={"fields": {"sweeps": names, "cron": plan.cron, "next": at.isoformat()}},
            )
        while not stop.is_set():
            now = self._clock()
            ready = [i for i, at in due.items() if at <= now]
            if not ready:
                nap = min((at - now).total_seconds() for at in due.values())
                if await self._wait(stop, min(nap, _MAX_NAP_SECONDS)):
                    break
                continue
            for i in ready:
                await self._run(self._plans[i].sweeps, now)
                due[i] = self._plans[i].next_after(self._clock())
        log.info("scheduler stopped")
