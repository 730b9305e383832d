"""`san-recovery`: the recovery sweeps and the daily TIL batch.

    san-recovery                 # = serve: run the sweeps on their schedules (make run)
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

from san_common import cli, probes
from san_common.db.engine import create_session_factory
from san_common.dependencies import require_database
from san_common.logs import configure_service_logging
from san_common.probes import Readiness
from san_common.process import serve
from san_common.settings import load_settings
from san_recovery.runner import run_requested, run_sweeps
from san_recovery.scheduler import Plan, Scheduler, wait_for_stop
from san_recovery.settings import RecoverySettings
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


async def run_scheduler(settings: RecoverySettings) -> None:
    engine = settings.database_engine()
    sessions = create_session_factory(engine)
    policy = settings.policy()
    stale_after = timedelta(seconds=settings.recovery_request_stale_seconds)
    plans = [
        Plan(settings.recovery_schedule, PERIODIC),
        Plan(settings.recovery_til_schedule, DAILY),
    ]

    async def work(stop: asyncio.Event) -> None:
        async def run(sweeps: Sequence[Sweep], _scheduled_at: datetime) -> None:
            # Not the scheduled time: each sweep reads the clock when it starts.
            await run_sweeps(sessions, sweeps, policy=policy, stop=stop)

        await asyncio.gather(Scheduler(plans, run).run(stop), serve_requests(stop))

    async def serve_requests(stop: asyncio.Event) -> None:
        """Operators' "run now" (admin API), read every few seconds."""
        while not stop.is_set():
            try:
                while (
                    await run_requested(sessions, policy=policy, stop=stop, stale_after=stale_after)
                    is not None
                ):
                    pass
            except Exception:  # the database is down: the next poll tries again
                log.exception("could not read the operators' sweep requests")
            if await wait_for_stop(stop, settings.recovery_request_poll_seconds):
                return

    try:
        await require_database(PROG, engine, settings.database_url)
        # Recovery needs only the database: it publishes through the outbox, never the broker.
        await serve(settings, work, Readiness({"database": probes.database(engine)}))
    finally:
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
