"""The maintenance schedule: every periodic task of the job engine, in one process.

`san-recovery serve` runs each `Task` in a loop of its own, every `every` seconds, next to
the cron-scheduled sweeps (scheduler.py). Each round is guarded: a PostgreSQL outage is
logged once for the whole process (`san_common.outages`), any other error with its
traceback, and the next round tries again. The tasks and their intervals are listed in
docs/architecture.md ("Maintenance"); `tasks()` in main.py builds them from the settings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from san_common.outages import DATABASE
from san_recovery.scheduler import wait_for_stop


@dataclass(frozen=True)
class Task:
    name: str
    every: float  # seconds between the end of one round and the start of the next
    run: Callable[[], Awaitable[object]]


async def run_tasks(tasks: Sequence[Task], stop: asyncio.Event) -> None:
    """Every task on its interval until `stop` is set; a round in progress then ends."""
    await asyncio.gather(*(_every(task, stop) for task in tasks))


async def _every(task: Task, stop: asyncio.Event) -> None:
    while not stop.is_set():
        async with DATABASE.guard(task.name):
            await task.run()
        if await wait_for_stop(stop, task.every):
            return
