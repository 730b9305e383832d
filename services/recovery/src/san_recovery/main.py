"""`san-recovery`: the maintenance service — lease rescue, the stranded-message check,
the runnable-jobs gauge, outbox cleanup, the recovery sweeps and the daily TIL batch
(docs/architecture.md, "Maintenance").

    san-recovery                 # = serve: run every task on its schedule (make run)
    san-recovery serve
    san-recovery run SWEEP... [--json]   # once, e.g. from a Kubernetes CronJob

SWEEP is ghost, failed, orphans, unrefined, daily-til or all. `run` prints what each sweep
did and exits 0, or 1 when a sweep (or one of its candidates) failed; a bad name exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import cli, probes
from san_common.broker.depths import QueueDepths
from san_common.broker.topology import Topology
from san_common.db.engine import create_session_factory
from san_common.dependencies import require_database
from san_common.logs import configure_service_logging
from san_common.probes import Readiness
from san_common.process import serve
from san_common.settings import load_settings
from san_recovery import outbox_cleanup, request_state
from san_recovery.maintenance import Task, run_tasks
from san_recovery.rescuer import LeaseRescuer
from san_recovery.runnable import RunnableGauge
from san_recovery.runner import run_requested, run_sweeps
from san_recovery.scheduler import Plan, Scheduler
from san_recovery.settings import RecoverySettings
from san_recovery.stranded import StrandedCheck
from san_recovery.sweeps import ALL, DAILY, PERIODIC, Sweep

PROG = "san-recovery"
log = logging.getLogger(__name__)

_CHOICES = [s.value for s in Sweep] + ["all"]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = cli.parser(PROG, __doc__ or "", distribution="san-recovery")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="run the sweeps on their schedules (the default)")
    once = commands.add_parser("run", help="run sweeps once and print what they did")
    once.add_argument(
        "sweeps", nargs="+", choices=_CHOICES, metavar="SWEEP",
        help=f"one or more of {', '.join(_CHOICES)} (all = every sweep, in order)",
    )  # fmt: skip
    once.add_argument("--json", action="store_true", help="print one JSON document")
    return parser.parse_args(argv)


async def run_once(settings: RecoverySettings, sweeps: Sequence[Sweep], *, as_json: bool) -> int:
    """Run `sweeps` once, print what they did; the exit code (0 = every sweep succeeded)."""
    engine = settings.database_engine()
    try:
        # No start-up check: an unreachable database is each sweep's reported error.
        reports = await run_sweeps(
            create_session_factory(engine), sweeps, policy=settings.policy(), trigger="cli"
        )
    finally:
        await engine.dispose()
    ok = all(r.ok for r in reports)
    if as_json:
        print(json.dumps({"ok": ok, "sweeps": [r.as_dict() for r in reports]}))
    else:
        for report in reports:
            print(report.line())
    return 0 if ok else 1


def tasks(
    settings: RecoverySettings,
    sessions: async_sessionmaker[AsyncSession],
    depths: QueueDepths,
    stop: asyncio.Event,
) -> list[Task]:
    """The periodic tasks, each with its interval (the sweeps run on their cron plans)."""
    policy = settings.policy()
    stale_after = timedelta(seconds=settings.recovery_request_stale_seconds)
    rescuer = LeaseRescuer(sessions, batch_size=settings.recovery_rescue_batch_size)
    stranded = StrandedCheck(
        sessions,
        depths,
        Topology(settings.amqp_prefix),
        grace=timedelta(seconds=settings.recovery_stranded_grace_seconds),
    )
    runnable = RunnableGauge(sessions, depths, Topology(settings.amqp_prefix))
    retention = timedelta(hours=settings.outbox_retention_hours)

    async def requests() -> None:
        """Operators' "run now" (admin API), every one waiting."""
        while await run_requested(sessions, policy=policy, stop=stop, stale_after=stale_after):
            pass

    return [
        Task("lease rescue", settings.recovery_rescue_seconds, rescuer.run_once),
        Task("stranded-message check", settings.recovery_stranded_seconds, stranded.run_once),
        Task("runnable-jobs gauge", settings.recovery_runnable_seconds, runnable.run_once),
        Task("operators' sweep requests", settings.recovery_request_poll_seconds, requests),
        Task(
            "outbox cleanup",
            settings.outbox_cleanup_interval_seconds,
            lambda: outbox_cleanup.clean(sessions, retention),
        ),
        Task(
            "request-state cleanup",
            settings.recovery_request_state_cleanup_seconds,
            lambda: request_state.clean(sessions),
        ),
    ]


async def run_scheduler(settings: RecoverySettings) -> None:
    engine = settings.database_engine()
    sessions = create_session_factory(engine)
    depths = QueueDepths(settings.amqp_url)
    policy = settings.policy()
    plans = [
        Plan(settings.recovery_schedule, PERIODIC),
        Plan(settings.recovery_til_schedule, DAILY),
    ]

    async def work(stop: asyncio.Event) -> None:
        async def run(sweeps: Sequence[Sweep], _scheduled_at: datetime) -> None:
            # Not the scheduled time: each sweep reads the clock when it starts.
            await run_sweeps(sessions, sweeps, policy=policy, stop=stop)

        periodic = tasks(settings, sessions, depths, stop)
        await asyncio.gather(Scheduler(plans, run).run(stop), run_tasks(periodic, stop))

    try:
        await require_database(PROG, engine, settings.database_url)
        # It reads the queues' depths from the broker, and publishes only through the
        # outbox: without the broker the stranded check waits, everything else runs.
        await serve(settings, work, Readiness({"database": probes.database(engine)}))
    finally:
        await depths.close()
        await engine.dispose()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    settings = load_settings(RecoverySettings)
    if args.command in (None, "serve"):
        cli.run(PROG, run_scheduler(settings))
        return
    configure_service_logging(settings)
    # Always in the canonical order: ghosts first, so their re-registrations supersede.
    sweeps = tuple(s for s in ALL if "all" in args.sweeps or s.value in args.sweeps)
    raise SystemExit(asyncio.run(run_once(settings, sweeps, as_json=args.json)))


if __name__ == "__main__":
    main()
