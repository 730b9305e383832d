"""`make bench`: SAN side by side with its peers, plus SAN's own ratios, in one run.

- Starts (or finds) PostgreSQL and RabbitMQ the way the test suite does (tests/infra.py):
  one embedded PostgreSQL and the local broker, shared by every system.
- Installs the peers (benchmarks/peers/requirements.txt) from PyPI into their own virtual
  environment, `.bench/peers-venv`, never into SAN's.
- Runs every scenario for every system interleaved — round 1: SAN, procrastinate,
  pgqueuer, Celery, Dramatiq, durable Dramatiq, the like-for-like peer (durable Dramatiq
  writing a job status row to PostgreSQL); round 2: the same again; … — so a burst of load
  from elsewhere on this shared machine hits every system rather than one.
- Then SAN's own ratios, each against a baseline measured in the same run, alternating
  A B A B: `POST /scraps` against a bare FastAPI + asyncpg endpoint doing the same
  transaction; the relay against a raw pipelined aio-pika publisher; similar cards at
  100k cards of one user against the index-forced SQL and the exact scan (recall@10).
- With `--before REV`, SAN as of git revision REV runs as one more system in the same
  rounds (its own checkout under `.bench/`, its own virtual environment from its own lock
  file, its own database migrated by its own code, its own queue prefix), and a "before →
  after" table compares its drain and burst with this checkout's.
- Prints one Markdown table (median and min–max over the runs) and writes it with the
  raw figures as JSON to `benchmarks/results/` (`last.md`, `last.json`).

Nothing here asserts a timing: the figures are reported, and docs/performance.md quotes
the last run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.peers.common import CPU_PREFIX, PEAK_RSS_MB, PEAK_RSS_PREFIX
from benchmarks.peers.san_peer import drop_topology
from san_common.db.engine import plain_url
from san_common.db.migrate import upgrade
from tests import infra

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PEERS_VENV = ROOT / ".bench" / "peers-venv"
PEERS = ("procrastinate", "pgqueuer", "celery", "dramatiq")  # issue 13's, with their defaults
# Dramatiq made as durable on the broker as SAN (a quorum queue, publisher confirms), and
# the like-for-like peer: that, plus a job status row in PostgreSQL written on enqueue,
# start and finish, as an application like SAN would use it. Issue 40's paced bars.
DURABLE, LIKE_FOR_LIKE = "dramatiq_durable", "dramatiq_pg"
SYSTEMS = ("san", *PEERS, DURABLE, LIKE_FOR_LIKE)  # in the order they run and are reported
LABELS = {
    "san": "SAN",
    "procrastinate": "procrastinate (PostgreSQL)",
    "pgqueuer": "pgqueuer (PostgreSQL)",
    "celery": "Celery (RabbitMQ)",
    "dramatiq": "Dramatiq (RabbitMQ)",
    DURABLE: "Dramatiq durable (quorum queue + publisher confirms)",
    LIKE_FOR_LIKE: "like-for-like: Dramatiq durable + PostgreSQL status row",
}
BEFORE = "san_before"  # SAN as of `--before REV`, run beside this checkout's
REPORTED = ("san", BEFORE, *SYSTEMS[1:])  # the order of the tables' rows


@dataclass(frozen=True)
class Runner:
    """How to run one system's driver: which interpreter, from which checkout, with
    which extra environment."""

    python: Path
    module: str
    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=dict)


def _uv() -> str:
    for candidate in (os.environ.get("UV"), shutil.which("uv"), str(ROOT / ".tools/bin/uv")):
        if (candidate and Path(candidate).exists()) or (candidate and shutil.which(candidate)):
            return candidate
    raise SystemExit("uv not found: run `make setup` first")


def ensure_peers_venv() -> Path:
    python = PEERS_VENV / "bin" / "python"
    requirements = ROOT / "benchmarks" / "peers" / "requirements.txt"
    stamp = PEERS_VENV / ".requirements"
    if python.exists() and stamp.exists() and stamp.read_text() == requirements.read_text():
        return python
    uv = _uv()
    env = {**os.environ, "UV_SYSTEM_CERTS": os.environ.get("UV_SYSTEM_CERTS", "1")}
    subprocess.run(
        [uv, "venv", "--quiet", "--allow-existing", str(PEERS_VENV)], check=True, env=env
    )
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(python), "-r", str(requirements)],
        check=True,
        env=env,
    )
    stamp.write_text(requirements.read_text())
    return python


async def create_database(server_url: str, name: str) -> str:
    connection = await asyncpg.connect(plain_url(infra.with_database(server_url, "postgres")))
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return plain_url(infra.with_database(server_url, name))


def load_note() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"


def run_prefixes() -> dict[str, str]:
    """The AMQP prefixes of this run: its own, so that two benches at once (on the one
    shared broker) never hold the same prefix, which the deployment-ownership guard
    refuses (san_common/broker/ownership.py). SAN, SAN before and the relay ratio each
    have one: they never share a queue."""
    run = uuid.uuid4().hex[:8]
    return {
        "san": f"sanbench_{run}",
        BEFORE: f"sanbench_before_{run}",
        "relay": f"sanbench_relay_{run}",
    }


def before_checkout(revision: str, prefix: str) -> Runner:
    """SAN as of `revision`: its tree (`git archive`, no worktree of the repository's own)
    under `.bench/`, with its own virtual environment built from its own lock file."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    checkout = ROOT / ".bench" / f"before-{commit[:12]}"
    if not (checkout / "pyproject.toml").exists():
        checkout.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", commit], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive, check=True)
    env = {**os.environ, "UV_SYSTEM_CERTS": os.environ.get("UV_SYSTEM_CERTS", "1")}
    env.pop("VIRTUAL_ENV", None)  # this checkout's, which uv would otherwise warn about
    subprocess.run([_uv(), "sync", "--frozen", "--quiet"], cwd=checkout, check=True, env=env)
    return Runner(
        checkout / ".venv" / "bin" / "python",
        "benchmarks.peers.san_peer",
        checkout,
        {"BENCH_SAN_PREFIX": prefix},
    )


def migrate_with(runner: Runner, database_url: str) -> None:
    """Migrate with the runner's own code (its migrations, not this checkout's)."""
    subprocess.run(
        [
            str(runner.python),
            "-c",
            "import sys; from san_common.db.migrate import upgrade; upgrade(sys.argv[1])",
            database_url,
        ],
        cwd=runner.cwd,
        check=True,
    )


def run_driver(
    runner: Runner, database_url: str, amqp_url: str, scenario: str, args: Any
) -> dict[str, Any]:
    command = [
        str(runner.python),
        "-m",
        runner.module,
        "drive",
        "--database-url",
        database_url,
        "--amqp-url",
        amqp_url,
        "--scenario",
        scenario,
        "--jobs",
        str(args.jobs),
        "--rate",
        str(args.paced_rate),
        "--seconds",
        str(args.paced_seconds),
    ]
    load_before = load_note()
    done = subprocess.run(
        command,
        cwd=runner.cwd,
        env={**os.environ, **runner.env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return {"scenario": scenario, "error": done.stderr.strip().splitlines()[-1:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["load"] = f"{load_before} → {load_note()}"
    return result


def summary(values: Sequence[float | None]) -> dict[str, float] | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def fmt(stat: dict[str, float] | None, unit: str = "", digits: int = 0) -> str:
    if stat is None:
        return "—"
    return (
        f"**{stat['median']:,.{digits}f}**{unit} "
        f"({stat['min']:,.{digits}f}–{stat['max']:,.{digits}f})"
    )


def peer_rows(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for system, by_scenario in results.items():
        row: dict[str, Any] = {}
        drain = by_scenario.get("drain", [])
        burst = by_scenario.get("burst", [])
        paced = by_scenario.get("paced", [])
        row["drain_rate"] = summary([r.get("rate") for r in drain])
        row["burst_rate"] = summary([r.get("rate") for r in burst])
        row["burst_p50_ms"] = summary([r.get("latency_p50_ms") for r in burst])
        row["burst_p99_ms"] = summary([r.get("latency_p99_ms") for r in burst])
        row["burst_enqueue_rate"] = summary([r.get("extra", {}).get("enqueue_rate") for r in burst])
        row["paced_p50_ms"] = summary([r.get("latency_p50_ms") for r in paced])
        row["paced_p99_ms"] = summary([r.get("latency_p99_ms") for r in paced])
        row["drain_cpu"] = cpu_medians(drain)
        row["burst_cpu"] = cpu_medians(burst)
        row["paced_cpu"] = cpu_medians(paced)
        row["errors"] = [r["error"] for rs in by_scenario.values() for r in rs if "error" in r]
        row["peak_rss_mb"] = peak_rss(r for rs in by_scenario.values() for r in rs)
        table[system] = row
    return table


def cpu_medians(outcomes: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The median over runs of each part's CPU per job (ms; benchmarks/peers/common.py)."""
    parts: dict[str, list[float]] = {}
    for outcome in outcomes:
        for key, value in outcome.get("extra", {}).items():
            if key.startswith(CPU_PREFIX):
                parts.setdefault(key.removeprefix(CPU_PREFIX), []).append(float(value))
    return {name: statistics.median(values) for name, values in parts.items()}


# The parts of the CPU table, in the order a job passes them.
CPU_PARTS = ("driver", "relay", "RabbitMQ", "worker", "PostgreSQL", "all")


def render_cpu(table: dict[str, dict[str, Any]], paced_rate: float) -> str:
    lines = [
        "| CPU per job (ms, median of runs) | scenario | "
        + " | ".join("driver (enqueue, poll)" if p == "driver" else p for p in CPU_PARTS)
        + " |",
        "|---|---|" + "---|" * len(CPU_PARTS),
    ]
    for system in REPORTED:
        for scenario in ("drain", "burst", "paced"):
            cpu = table.get(system, {}).get(f"{scenario}_cpu")
            if cpu:
                cells = " | ".join(
                    f"**{cpu[p]:.2f}**"
                    if p == "all" and p in cpu
                    else (f"{cpu[p]:.2f}" if p in cpu else "—")
                    for p in CPU_PARTS
                )
                name = f"paced {paced_rate:g}/s" if scenario == "paced" else scenario
                lines.append(f"| {LABELS[system]} | {name} | {cells} |")
    return "\n".join(lines)


def peak_rss(outcomes: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The largest peak RSS (VmHWM, MB) of each of a system's processes over its runs, as
    the drivers read it just before stopping them (benchmarks/peers/common.py)."""
    peaks: dict[str, float] = {}
    for outcome in outcomes:
        for key, value in outcome.get("extra", {}).items():
            if key.startswith(PEAK_RSS_PREFIX):
                name = key.removeprefix(PEAK_RSS_PREFIX)
                peaks[name] = max(peaks.get(name, 0.0), float(value))
    return peaks


def render_rss(table: dict[str, dict[str, Any]], ratios_rss: dict[str, float]) -> str:
    lines = [
        "| peak RSS (VmHWM, MB; largest over every scenario and run) | worker process "
        "| other processes |",
        "|---|---|---|",
    ]
    for system in REPORTED:
        peaks = dict(table.get(system, {}).get("peak_rss_mb") or {})
        if peaks:
            worker = peaks.pop("worker", None)
            others = ", ".join(f"`{name}` {mb:,.0f}" for name, mb in sorted(peaks.items()))
            lines.append(
                f"| {LABELS[system]} | {'—' if worker is None else f'{worker:,.0f}'} "
                f"| {others or '—'} |"
            )
    if ratios_rss:
        cells = ", ".join(f"`{name}` {mb:,.0f}" for name, mb in sorted(ratios_rss.items()))
        lines.append(
            f"| SAN's ratios (API, relay and API at 100k cards, under load) | — | {cells} |"
        )
    return "\n".join(lines)


def render_peers(table: dict[str, dict[str, Any]], args: Any) -> str:
    lines = [
        f"| system | drain {args.jobs:,} queued (jobs/s) | burst of {args.jobs:,}: "
        "enqueue→done (jobs/s) | burst: enqueue rate (jobs/s) | burst: enqueue→done p50 / p99 (ms) "
        f"| paced {args.paced_rate:g} jobs/s: enqueue→start p50 (ms) | paced: p99 (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for system in REPORTED:
        if system not in table:
            continue
        row = table[system]
        burst_lat = (
            f"{row['burst_p50_ms']['median']:,.0f} / {row['burst_p99_ms']['median']:,.0f}"
            if row["burst_p50_ms"]
            else "—"
        )
        lines.append(
            f"| {LABELS[system]} | {fmt(row['drain_rate'])} | {fmt(row['burst_rate'])} "
            f"| {fmt(row['burst_enqueue_rate'])} | {burst_lat} "
            f"| {fmt(row['paced_p50_ms'], digits=1)} | {fmt(row['paced_p99_ms'], digits=1)} |"
        )
    return "\n".join(lines)


def render_before_after(table: dict[str, dict[str, Any]], revision: str) -> str:
    """This checkout's SAN against SAN as of `revision`, measured in the same rounds."""
    lines = [
        f"| SAN, same run (jobs/s) | before (`{revision}`) | after (this checkout) "
        "| after / before |",
        "|---|---|---|---|",
    ]
    for key, label in (("drain_rate", "drain"), ("burst_rate", "burst enqueue→done")):
        before = table.get(BEFORE, {}).get(key)
        after = table.get("san", {}).get(key)
        ratio = f"{after['median'] / before['median']:.3f}×" if before and after else "—"
        lines.append(f"| {label} | {fmt(before)} | {fmt(after)} | {ratio} |")
    return "\n".join(lines)


def issue_40(table: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """Issue 40's bars: pgqueuer's CPU per burst job, drain and burst; the paced p99 of
    durable Dramatiq and of the like-for-like peer."""

    def med(system: str, key: str) -> float | None:
        stat = table.get(system, {}).get(key)
        return None if stat is None else float(stat["median"])

    def cpu(system: str) -> float | None:
        return table.get(system, {}).get("burst_cpu", {}).get("all")

    rows: list[tuple[str, str]] = []
    san_cpu, pgq_cpu = cpu("san"), cpu("pgqueuer")
    if san_cpu and pgq_cpu:
        rows.append(
            (
                "40: CPU per burst job (all processes) ≤ 1.0 × pgqueuer's",
                f"{san_cpu / pgq_cpu:.2f}× ({san_cpu:.2f} vs {pgq_cpu:.2f} ms)",
            )
        )
    for key, label in (("drain_rate", "drain"), ("burst_rate", "burst enqueue→done")):
        san, pgq = med("san", key), med("pgqueuer", key)
        if san and pgq:
            rows.append((f"40: {label} ≥ 1.0 × pgqueuer", f"{san / pgq:.2f}×"))
    san_p99 = med("san", "paced_p99_ms")
    for peer, bound in ((DURABLE, 1.5), (LIKE_FOR_LIKE, 1.0)):
        peer_p99 = med(peer, "paced_p99_ms")
        if san_p99 and peer_p99:
            rows.append(
                (
                    f"40: paced p99 ≤ {bound} × {LABELS[peer]}",
                    f"{san_p99 / peer_p99:.2f}× ({san_p99:.1f} vs {peer_p99:.1f} ms)",
                )
            )
    return rows


def acceptance(table: dict[str, dict[str, Any]], extra: dict[str, Any]) -> list[tuple[str, str]]:
    """Issues 13's and 40's acceptance ratios, computed from this run's medians (reported,
    not asserted); each bar's label names the peer it is measured against."""

    def med(system: str, key: str) -> float | None:
        stat = table.get(system, {}).get(key)
        return None if stat is None else float(stat["median"])

    rows: list[tuple[str, str]] = []
    san_drain = med("san", "drain_rate")
    pgq = med("pgqueuer", "drain_rate")
    rabbit = [v for v in (med("celery", "drain_rate"), med("dramatiq", "drain_rate")) if v]
    if san_drain and pgq:
        rows.append(("drain ≥ 1.0 × pgqueuer", f"{san_drain / pgq:.2f}×"))
    if san_drain and rabbit:
        rows.append(("drain ≥ 0.8 × max(Celery, Dramatiq)", f"{san_drain / max(rabbit):.2f}×"))
    peers_burst = [med(s, "burst_rate") for s in PEERS]
    best_burst = max((v for v in peers_burst if v), default=None)
    san_burst = med("san", "burst_rate")
    if san_burst and best_burst:
        rows.append(("burst enqueue→done ≥ 1.0 × best peer", f"{san_burst / best_burst:.2f}×"))
    peers_p99 = [med(s, "paced_p99_ms") for s in PEERS]
    best_p99 = min((v for v in peers_p99 if v), default=None)
    san_p99 = med("san", "paced_p99_ms")
    if san_p99 and best_p99:
        rows.append(
            (
                "paced p99 ≤ 1.5 × best peer's and < 20 ms",
                f"{san_p99 / best_p99:.2f}× ({san_p99:.1f} ms vs {best_p99:.1f} ms)",
            )
        )
    rows.extend(issue_40(table))
    for key, label in (
        ("api_c16", "POST /scraps ≥ 0.7 × bare endpoint, c=16"),
        ("api_c64", "POST /scraps ≥ 0.7 × bare endpoint, c=64"),
        ("api_p99_c64", "POST /scraps p99 at c=64 ≤ 2 × bare"),
        ("api_cpu_c16", "(reported, no bar) POST /scraps, server CPU per request vs bare, c=16"),
        ("api_cpu_c64", "(reported, no bar) POST /scraps, server CPU per request vs bare, c=64"),
        ("api_limited_c16", "(reported, no bar) POST /scraps, limits on, vs bare, c=16"),
        ("api_limited_c64", "(reported, no bar) POST /scraps, limits on, vs bare, c=64"),
        ("relay", "relay ≥ 0.9 × raw pipelined publisher"),
        ("similar_p99", "similar cards p99 ≤ 2 × index-forced SQL p99"),
        ("similar_recall", "similar cards recall@10 ≥ 0.95"),
    ):
        if key in extra:
            rows.append((label, extra[key]))
    return rows


async def main_async(args: Any) -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    log_dir = ROOT / ".bench" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    os.environ["BENCH_LOG_DIR"] = str(log_dir)
    started = time.time()
    systems = [s for s in SYSTEMS if s in args.systems]
    prefixes = run_prefixes()
    os.environ["BENCH_SAN_PREFIX"] = prefixes["san"]  # read by san_peer, in its process
    args.relay_prefix = prefixes["relay"]
    peers_python = ensure_peers_venv() if any(s != "san" for s in systems) else None
    runners = {
        s: Runner(Path(sys.executable), "benchmarks.peers.san_peer")
        if s == "san"
        else Runner(peers_python or Path(), f"benchmarks.peers.{s}_peer")
        for s in systems
    }
    if args.before:
        runners[BEFORE] = before_checkout(args.before, prefixes[BEFORE])
        LABELS[BEFORE] = f"SAN before (`{args.before}`)"
        systems.insert(systems.index("san") + 1 if "san" in systems else 0, BEFORE)
    print(f"peers installed in {time.time() - started:.0f}s", flush=True)
    # Where the wall time went (benchmarks/results/performance-history.md, "Wall time").
    phases: dict[str, float] = {"peers venv": time.time() - started}
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} · {os.cpu_count()} CPUs · {platform.platform()}",
        "python": platform.python_version(),
        "runs": args.runs,
        "load_at_start": load_note(),
    }
    mark = time.time()
    with infra.postgres_server() as server, infra.rabbitmq_server() as amqp_url:
        async with contextlib.AsyncExitStack() as cleanup:
            # the run's queues go when it ends, however it ends
            for system in ("san", BEFORE):
                if system in systems:
                    cleanup.push_async_callback(drop_topology, amqp_url, prefixes[system])
            phases["servers and databases"] = time.time() - mark
            results: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in systems}
            databases: dict[str, str] = {}
            for system in systems:
                databases[system] = await create_database(server, f"bench_{system}")
                if system == "san":
                    await asyncio.to_thread(upgrade, databases[system])
                elif system == BEFORE:
                    await asyncio.to_thread(migrate_with, runners[system], databases[system])
            for round_no in range(args.runs):
                for scenario in args.scenarios:
                    for system in systems:
                        mark = time.time()
                        outcome = run_driver(
                            runners[system], databases[system], amqp_url, scenario, args
                        )
                        key = f"scenarios: {system}"
                        phases[key] = phases.get(key, 0.0) + time.time() - mark
                        results[system].setdefault(scenario, []).append(outcome)
                        line = f"round {round_no + 1} {scenario:6} {system:16} {outcome}"
                        print(line, flush=True)
            table = peer_rows(results)
            extra: dict[str, Any] = {}
            sections: list[str] = []
            if not args.skip_san_ratios:
                from benchmarks import san_ratios

                mark = time.time()
                ratios = await san_ratios.run_all(server, amqp_url, args, extra)
                phases["SAN's ratios"] = time.time() - mark
                if "similar" in ratios:
                    fill = ratios["similar"]["fill_seconds"]
                    phases["SAN's ratios: card data + HNSW build"] = fill
                report["san_ratios"] = ratios
                sections.append(san_ratios.render(ratios))
    report["peers"] = {"raw": results, "summary": table}
    report["load_at_end"] = load_note()
    report["seconds"] = round(time.time() - started)
    report["phases_seconds"] = {name: round(seconds, 1) for name, seconds in phases.items()}
    report["peak_rss_mb_san_ratios"] = dict(PEAK_RSS_MB)  # processes this one stopped
    checks = acceptance(table, extra)
    report["acceptance"] = checks
    text = [
        f"### `make bench` — {report['date']}",
        f"Machine: {report['machine']}, Python {report['python']}; load average "
        f"(1/5 min) {report['load_at_start']} at start, {report['load_at_end']} at end; "
        f"{args.runs} interleaved runs, median (min–max); {report['seconds']} s in all.",
        "",
        render_peers(table, args),
        "",
        *([render_before_after(table, args.before), ""] if args.before else []),
        render_cpu(table, args.paced_rate),
        "",
        render_rss(table, report["peak_rss_mb_san_ratios"]),
        "",
        *sections,
        "",
        "| acceptance (issue 13; 40: issue 40) | this run |",
        "|---|---|",
        *(f"| {label} | {value} |" for label, value in checks),
        "",
        "Wall time: "
        + ", ".join(f"{name} {seconds:,.0f} s" for name, seconds in phases.items())
        + f"; {report['seconds']:,} s in all.",
    ]
    rendered = "\n".join(text) + "\n"
    print("\n" + rendered)
    (RESULTS / f"{args.name}.md").write_text(rendered)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2, default=str))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="make bench", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--paced-rate", type=float, default=20.0)
    parser.add_argument("--paced-seconds", type=float, default=10.0)
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=["drain", "burst", "paced"],
        choices=["drain", "burst", "paced"],
    )
    parser.add_argument("--skip-san-ratios", action="store_true")
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also run SAN as of git revision REV in the same rounds, and compare",
    )
    parser.add_argument("--name", default="last", help="results file name (benchmarks/results/)")
    parser.add_argument(
        "--cards", type=int, default=100_000, help="similar cards: cards of one user"
    )
    parser.add_argument("--only-ratios", nargs="*", default=None, help="api relay similar")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
