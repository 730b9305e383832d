"""Run sweeps: the transaction, the per-sweep advisory lock, batching, logs and metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import metrics
from san_common.errors import cause_chain, is_connection_loss
from san_common.outages import DATABASE
from san_recovery import repository
from san_recovery.policy import Policy
from san_recovery.sweeps import ALL, SWEEPS, Sweep
from san_recovery.tally import Tally

log = logging.getLogger(__name__)

# How often a "run now" request is taken before it ends unrun: a request whose process
# never got to finish it may be what kills that process.
MAX_REQUEST_ATTEMPTS = 5


class RunStatus(StrEnum):
    DONE = "done"
    LOCKED = "locked"  # another replica is running this sweep right now: nothing to do
    ERROR = "error"


@dataclass
class SweepReport:
    sweep: Sweep
    status: RunStatus = RunStatus.DONE
    tally: Tally = field(default_factory=Tally)
    batches: int = 0
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status != RunStatus.ERROR and self.tally.total.errors == 0

    def as_dict(self) -> dict[str, object]:
        return {
            "sweep": self.sweep.value,
            "status": self.status.value,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "totals": self.tally.total.as_dict(),
            "by_job_type": {str(t): c.as_dict() for t, c in sorted(self.tally.by_type.items())},
        }

    def line(self) -> str:
        """One readable line: totals, then `TYPE found/registered/given up` per job type."""
        total = self.tally.total
        text = (
            f"{self.sweep.value}: {self.status.value}, found {total.found}, "
            f"registered {total.registered}, given up {total.given_up}, "
            f"skipped {total.skipped}, errors {total.errors}"
        )
        if self.tally.by_type:
            text += (
                " ("
                + ", ".join(
                    f"{t} {c.found}/{c.registered}/{c.given_up}"
                    for t, c in sorted(self.tally.by_type.items())
                )
                + ")"
            )
        if self.error:
            text += f"; {self.error}"
        return text


async def run_sweep(
    sessions: async_sessionmaker[AsyncSession],
    sweep: Sweep,
    *,
    now: datetime,
    policy: Policy,
    stop: asyncio.Event | None = None,
    trigger: str = "schedule",
    request_id: int | None = None,
) -> SweepReport:
    """Batches of `policy.batch_size`, one transaction each, until a batch comes back
    short or settles nothing (what it could not settle waits for the next run)."""
    report = SweepReport(sweep)
    started = time.monotonic()
    started_at = datetime.now(UTC)
    try:
        while True:
            async with sessions() as session, session.begin():
                if not await repository.try_sweep_lock(session, sweep.value):
                    if report.batches == 0:
                        report.status = RunStatus.LOCKED
                    break
                batch = await SWEEPS[sweep](session, now, policy)
            report.batches += 1
            report.tally.merge(batch)
            if (
                batch.total.found < policy.batch_size
                or batch.progress == 0
                or (stop is not None and stop.is_set())
            ):
                break
    except Exception as exc:  # a run reports its failure; the scheduler and `run all` go on
        report.status = RunStatus.ERROR
        report.error = cause_chain(exc)
        if is_connection_loss(exc):
            DATABASE.lost(exc, f"sweep {sweep.value}")
        else:
            log.exception("sweep failed", extra={"fields": {"sweep": sweep.value}})
    report.seconds = time.monotonic() - started
    _record(report)
    await _remember(sessions, report, started_at, trigger, request_id)
    return report


async def _remember(
    sessions: async_sessionmaker[AsyncSession],
    report: SweepReport,
    started_at: datetime,
    trigger: str,
    request_id: int | None,
) -> None:
    """The run's row in the sweep history (the console's Sweeps page). Best effort: a run
    whose history cannot be written still happened, and the log line has it."""
    if report.status == RunStatus.LOCKED and trigger == "schedule":
        return  # another replica ran it; that replica records the run
    try:
        async with sessions() as session, session.begin():
            await repository.record_run(
                session,
                sweep=report.sweep.value,
                trigger=trigger,
                status=report.status.value,
                started_at=started_at,
                finished_at=datetime.now(UTC),
                batches=report.batches,
                totals=report.tally.total.as_dict(),
                error=report.error,
                request_id=request_id,
            )
    except Exception as exc:
        if is_connection_loss(exc):
            DATABASE.lost(exc, "recording a sweep run")
        else:
            log.exception(
                "could not record the sweep run", extra={"fields": {"sweep": report.sweep.value}}
            )


async def run_sweeps(
    sessions: async_sessionmaker[AsyncSession],
    sweeps: Sequence[Sweep],
    *,
    policy: Policy,
    now: datetime | None = None,
    stop: asyncio.Event | None = None,
    trigger: str = "schedule",
    request_id: int | None = None,
) -> list[SweepReport]:
    reports = []
    for sweep in sweeps:
        if stop is not None and stop.is_set():
            break
        at = now or datetime.now(UTC)
        reports.append(
            await run_sweep(
                sessions,
                sweep,
                now=at,
                policy=policy,
                stop=stop,
                trigger=trigger,
                request_id=request_id,
            )
        )
    return reports


async def run_requested(
    sessions: async_sessionmaker[AsyncSession],
    *,
    policy: Policy,
    stale_after: timedelta,
    stop: asyncio.Event | None = None,
) -> int | None:
    """Run the oldest operator request ("run now", from the admin API) that nobody runs,
    if any; its id, or None when there was none.

    While it runs, the request's heartbeat is beaten every `stale_after` / 4
    (RECOVERY_REQUEST_STALE_SECONDS): a process that dies mid-run leaves a request that
    the next poll of any replica takes again once `stale_after` has passed (the sweeps are
    idempotent, so running them again is safe). A run cut short by shutdown gives the
    request back for the next process."""
    async with sessions() as session, session.begin():
        request = await repository.claim_request(session, stale_after=stale_after)
    if request is None:
        return None
    attempt = request.attempts
    fields = {"request_id": request.id, "sweeps": request.sweeps, "by": request.requested_by}
    if attempt > MAX_REQUEST_ATTEMPTS:
        error = f"not run again: taken {attempt - 1} times, never finished"
        fields["error"] = error
        log.warning("operator's sweep request given up", extra={"fields": fields})
        async with sessions() as session, session.begin():
            await repository.finish_request(session, request.id, attempt, ok=False, error=error)
        return request.id
    log.info("operator asked for sweeps", extra={"fields": {**fields, "attempt": attempt}})
    names = set(request.sweeps)
    sweeps = [s for s in ALL if s.value in names]
    beating = asyncio.create_task(
        _beat(sessions, request.id, attempt, stale_after.total_seconds() / 4)
    )
    try:
        reports = await run_sweeps(
            sessions, sweeps, policy=policy, stop=stop, trigger="operator", request_id=request.id
        )
    finally:
        beating.cancel()
    async with sessions() as session, session.begin():
        if stop is not None and stop.is_set():
            held = await repository.give_back_request(session, request.id, attempt)
        else:
            ok = bool(reports) and all(r.ok for r in reports)
            held = await repository.finish_request(session, request.id, attempt, ok=ok)
    if not held:
        log.warning(
            "operator's sweep request was taken again while this process ran it; "
            "its outcome is the other run's",
            extra={"fields": {**fields, "attempt": attempt}},
        )
    return request.id


async def _beat(
    sessions: async_sessionmaker[AsyncSession], request_id: int, attempt: int, every: float
) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            async with sessions() as session, session.begin():
                if not await repository.beat_request(session, request_id, attempt):
                    return  # taken again (this process stalled): its finish is fenced out
        except Exception as exc:  # the next beat tries again; the run reports its errors
            if is_connection_loss(exc):
                DATABASE.lost(exc, "beating a sweep request's heartbeat")
            else:
                log.warning("could not beat the sweep request's heartbeat", exc_info=True)


def _record(report: SweepReport) -> None:
    sweep = report.sweep.value
    for job_type, counts in report.tally.by_type.items():
        metrics.RECOVERY_JOBS_FOUND.labels(sweep, str(job_type)).inc(counts.found)
        metrics.RECOVERY_JOBS_REGISTERED.labels(sweep, str(job_type)).inc(counts.registered)
        metrics.RECOVERY_JOBS_GIVEN_UP.labels(sweep, str(job_type)).inc(counts.given_up)
    metrics.RECOVERY_SWEEP_RUNS.labels(sweep, report.status.value).inc()
    if report.status == RunStatus.DONE:
        metrics.RECOVERY_LAST_SUCCESS.labels(sweep).set_to_current_time()
    total = report.tally.total
    log.log(
        logging.INFO if report.ok else logging.WARNING,
        "sweep %s: %s",
        sweep,
        report.status.value,
        extra={
            "fields": {
                "sweep": sweep,
                "status": report.status.value,
                **total.as_dict(),
                "batches": report.batches,
                "duration_ms": round(report.seconds * 1000),
                # a structure, not a string: a JSON log line nests it as an object
                "by_job_type": {str(t): c.as_dict() for t, c in report.tally.by_type.items()},
            }
        },
    )
