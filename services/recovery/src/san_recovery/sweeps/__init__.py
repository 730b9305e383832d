"""The sweeps, by name. Each is `(session, now, policy) -> Tally` over one batch, inside a
transaction the runner owns; none of them commits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from enum import StrEnum

from sqlalchemy.ext.asyncio import AsyncSession

from san_recovery.policy import Policy
from san_recovery.sweeps import daily_til, failed, ghost, retention, scraps
from san_recovery.tally import Tally


class Sweep(StrEnum):
    GHOST = "ghost"
    FAILED = "failed"
    ORPHANS = "orphans"
    UNREFINED = "unrefined"
    DAILY_TIL = "daily-til"
    RETENTION = "retention"


SweepFn = Callable[[AsyncSession, datetime, Policy], Awaitable[Tally]]

SWEEPS: dict[Sweep, SweepFn] = {
    Sweep.GHOST: ghost.sweep,
    Sweep.FAILED: failed.sweep,
    Sweep.ORPHANS: scraps.sweep_orphans,
    Sweep.UNREFINED: scraps.sweep_unrefined,
    Sweep.DAILY_TIL: daily_til.sweep,
    Sweep.RETENTION: retention.sweep,
}

# Ghosts first: their re-registrations then supersede the failures the failed sweep sees.
ALL: tuple[Sweep, ...] = tuple(Sweep)
PERIODIC: tuple[Sweep, ...] = (
    Sweep.GHOST,
    Sweep.FAILED,
    Sweep.ORPHANS,
    Sweep.UNREFINED,
    Sweep.RETENTION,
)
DAILY: tuple[Sweep, ...] = (Sweep.DAILY_TIL,)
