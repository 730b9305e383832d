"""`make soak`: each SAN service's memory over a long run at a steady load (issue 13,
acceptance 6: peak RSS reported, growth reported — nothing asserted).

- Finds PostgreSQL and RabbitMQ as `make bench` does (tests/infra.py): one database of its
  own, migrated, and an exchange/queue prefix of its own on the shared broker.
- Starts the five services as separate OS processes through their console scripts, as a
  deployment does: san-api, san-relay, san-ai-worker (`AI_PROVIDER=local`, the offline
  provider), san-github-worker, san-recovery — on their default settings.
- Drives `--rate` `POST /scraps` per second through the real API (each scrap registers a
  CARD_ANALYSIS and a SCRAP_REFINE job: 50 req/s is 100 jobs/s) on a fixed schedule (open
  loop: a slow answer does not delay the next request), from `--users` users in turn so that
  each stays under the per-user rate limit and active-job quota (limiter on by default;
  `--no-rate-limit` turns it off with RATE_LIMIT_ENABLED=false).
- Every `--sample-seconds` reads each service's RSS (VmRSS in /proc/<pid>/status, summed
  over the process and any children) and the database's progress (jobs by status, outbox
  rows not yet published).
- `--warmup-seconds` at full load first (not counted), then the soak proper, `--minutes`.
- Reports per service: RSS at the start of the soak, peak (sampled, and the kernel's
  VmHWM, which covers the warm-up too), end, and the trend (least-squares slope over the
  second half, MB/min); the jobs completed, the backlog at the end and whether the system
  kept up. Prints a Markdown table; writes `benchmarks/results/<name>.md` and `.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx

from benchmarks.peers.common import percentile, tree_kb
from tests import infra

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
VENV_BIN = Path(sys.executable).parent
# Stopped in this order: intake first, so the workers and the relay see no new work.
SERVICES = ("api", "relay", "ai-worker", "github-worker", "recovery")
SECRET = "soak-secret-" + "x" * 40
TOKEN_KEYS = "JqSQtt2DE8ApEO7q32BRyUIvVvRANJ0fPxXRu7AQrSA"
JOBS_PER_SCRAP = 2  # CARD_ANALYSIS + SCRAP_REFINE
# Words the offline provider turns into titles, tags, categories and embeddings; a scrap is
# a random draw of them plus its serial number (digits are not words to the provider, so
# each scrap is distinct without growing the users' tag sets).
VOCABULARY = """
python rust asyncio coroutine compiler function class algorithm library refactoring
postgresql database index query transaction schema pgvector vacuum replication partition
docker kubernetes helm terraform deploy container nginx linux monitoring prometheus
embedding transformer neural model learning gradient attention token inference training
http html react frontend backend browser fastapi django api cache latency throughput
queue broker message consumer publisher retry lease outbox relay worker scheduler
""".split()


# --- the arithmetic of the report (unit-tested in tests/unit/test_soak_trend.py) -------


def slope_per_minute(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, in value per minute; None when
    fewer than two distinct times."""
    if len(points) < 2:
        return None
    mean_t = statistics.fmean(t for t, _ in points)
    mean_v = statistics.fmean(v for _, v in points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    covariance = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return covariance / spread * 60


def trend(points: Sequence[tuple[float, float]], minutes: float) -> dict[str, Any]:
    """RSS (MB) over the soak (t ≥ 0): start, peak, end, the slope over the second half and
    over the whole soak, and a word for it. "flat" when the second half's slope, carried
    over the soak's length, adds under 2 MB or 2 % of the start; else "grows"/"shrinks"."""
    if not points:
        return {}
    end_t = points[-1][0]
    second_half = [p for p in points if p[0] >= end_t / 2]
    slope = slope_per_minute(second_half)
    start = points[0][1]
    verdict = "—"
    if slope is not None:
        threshold = max(2.0, 0.02 * start)
        verdict = (
            "flat" if abs(slope) * minutes < threshold else ("grows" if slope > 0 else "shrinks")
        )
    return {
        "start_mb": start,
        "peak_mb": max(v for _, v in points),
        "end_mb": points[-1][1],
        "slope_second_half_mb_per_min": slope,
        "slope_all_mb_per_min": slope_per_minute(points),
        "verdict": verdict,
    }


# --- the stack ---------------------------------------------------------------------------


@dataclass
class Stack:
    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    probe_ports: dict[str, int] = field(default_factory=dict)

    def start(self) -> None:
        for name in SERVICES:
            # /readyz: the API's own port; a worker's probe server's (PROBE_PORT)
            env = {**os.environ, **self.env, "SERVICE_NAME": name}
            if name == "api":
                self.probe_ports[name] = int(self.env["API_PORT"])
            else:
                self.probe_ports[name] = infra.free_port()
                env["PROBE_PORT"] = str(self.probe_ports[name])
            log = (self.log_dir / f"soak-{name}.log").open("wb")
            self.processes[name] = subprocess.Popen(
                [str(VENV_BIN / f"san-{name}")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()

    def exited(self) -> list[str]:
        return [
            f"{name} (exit {p.returncode})"
            for name, p in self.processes.items()
            if p.poll() is not None
        ]

    async def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2) as client:
            for name, port in self.probe_ports.items():
                while True:
                    if gone := self.exited():
                        raise RuntimeError(f"exited at start-up: {', '.join(gone)}; see logs")
                    try:
                        response = await client.get(f"http://127.0.0.1:{port}/readyz")
                        if response.status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{name} not ready after {timeout:.0f}s")
                    await asyncio.sleep(0.2)

    def stop(self) -> None:
        for name in SERVICES:
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- the load ----------------------------------------------------------------------------


@dataclass
class Load:
    sent: int = 0
    accepted: int = 0  # 202, new scrap
    duplicates: int = 0
    refused: int = 0  # 429: rate limit or active-job quota
    errors: int = 0  # other statuses and transport errors
    skipped: int = 0  # not sent: --max-in-flight requests already waiting
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return {
            "sent": self.sent,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "refused": self.refused,
            "errors": self.errors,
            "skipped": self.skipped,
        }


async def drive(
    base_url: str,
    tokens: Sequence[str],
    rate: float,
    until: float,
    max_in_flight: int,
    load: Load,
    seed: int,
) -> None:
    """POST /scraps `rate` times a second until `until` (monotonic), users in turn."""
    # Idle connections retired before the server's 5 s keep-alive (HTTP_KEEP_ALIVE_SECONDS)
    # closes them, so a request never races the server's close of a reused connection.
    limits = httpx.Limits(
        max_connections=max_in_flight, max_keepalive_connections=max_in_flight, keepalive_expiry=2
    )
    in_flight: set[asyncio.Task[None]] = set()
    rng = random.Random(seed)

    async def one(client: httpx.AsyncClient, token: str, content: str) -> None:
        started = time.perf_counter()
        try:
            response = await client.post(
                "/scraps",
                json={"content": content},
                headers={"Authorization": f"Bearer {token}"},
            )
        except httpx.HTTPError as exc:
            load.errors += 1
            key = type(exc).__name__
            load.statuses[key] = load.statuses.get(key, 0) + 1
            return
        load.latencies_ms.append((time.perf_counter() - started) * 1000)
        key = str(response.status_code)
        load.statuses[key] = load.statuses.get(key, 0) + 1
        if response.status_code == 202:
            if response.json().get("duplicate"):
                load.duplicates += 1
            else:
                load.accepted += 1
        elif response.status_code == 429:
            load.refused += 1
        else:
            load.errors += 1

    async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as client:
        began = time.monotonic()
        k = 0
        while True:
            due = began + k / rate
            if due >= until:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            k += 1
            if len(in_flight) >= max_in_flight:
                load.skipped += 1
                continue
            words = " ".join(rng.choices(VOCABULARY, k=rng.randint(20, 60)))
            content = f"{words}. Note {load.sent}."
            task = asyncio.create_task(one(client, tokens[load.sent % len(tokens)], content))
            load.sent += 1
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight, timeout=60)


# --- sampling ----------------------------------------------------------------------------

_PROGRESS = """
    SELECT count(*) AS jobs,
           count(*) FILTER (WHERE status = 'COMPLETED') AS completed,
           count(*) FILTER (WHERE status = 'FAILED') AS failed,
           count(*) FILTER (WHERE status IN ('PENDING', 'PROCESSING')) AS active,
           (SELECT count(*) FROM outbox_messages WHERE published_at IS NULL) AS unpublished
    FROM async_jobs
"""


async def sample(stack: Stack, db: asyncpg.Connection, t: float, load: Load) -> dict[str, Any]:
    rss = {name: tree_kb(p.pid) for name, p in stack.processes.items()}
    row = await db.fetchrow(_PROGRESS)
    return {
        "t": round(t, 1),
        "rss_mb": {name: None if kb is None else round(kb / 1024, 1) for name, kb in rss.items()},
        **dict(row),
        **load.counts(),
        "load_average": os.getloadavg()[0],
    }


async def sampler(
    stack: Stack,
    db: asyncpg.Connection,
    load: Load,
    soak_start: float,
    every: float,
    samples: list[dict[str, Any]],
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        samples.append(await sample(stack, db, time.monotonic() - soak_start, load))
        if gone := stack.exited():
            print(f"soak: exited during the run: {', '.join(gone)}", flush=True)
        last = samples[-1]
        print(
            f"soak t={last['t']:7.1f}s  "
            + " ".join(f"{n}={v}" for n, v in last["rss_mb"].items())
            + f"  jobs {last['completed']}/{last['jobs']} done, {last['active']} active,"
            f" {last['unpublished']} unpublished; sent {last['sent']}, refused"
            f" {last['refused']}, errors {last['errors']}, skipped {last['skipped']}",
            flush=True,
        )
        try:
            await asyncio.wait_for(stop.wait(), timeout=every)
        except TimeoutError:
            pass


# --- the run -----------------------------------------------------------------------------


async def _create_database(server_url: str) -> str:
    from benchmarks.run import create_database
    from san_common.db.migrate import upgrade

    url = await create_database(server_url, "bench_soak")
    await asyncio.to_thread(upgrade, url)
    return url


async def _drop_topology(amqp_url: str, prefix: str) -> None:
    from san_common.broker.topology import Topology

    topology = Topology(prefix)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        for name in topology.all_queue_names():
            await channel.queue_delete(name)
        await channel.exchange_delete(topology.jobs_exchange)
        await channel.exchange_delete(topology.dead_letter_exchange)
    finally:
        await connection.close()


async def _job_latencies(db: asyncpg.Connection, since: float, until: float) -> dict[str, Any]:
    row = await db.fetchrow(
        """
        SELECT count(*) AS n,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY finished_at - created_at) AS p50,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY finished_at - created_at) AS p99
        FROM async_jobs
        WHERE status = 'COMPLETED' AND created_at >= to_timestamp($1)
          AND created_at < to_timestamp($2)
        """,
        since,
        until,
    )
    return {
        "jobs": row["n"],
        "p50_ms": None if row["p50"] is None else row["p50"].total_seconds() * 1000,
        "p99_ms": None if row["p99"] is None else row["p99"].total_seconds() * 1000,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from san_api.auth.tokens import mint

    log_dir = ROOT / ".bench" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"sansoak_{uuid.uuid4().hex[:8]}"
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.node()} · {os.cpu_count()} CPUs · {platform.platform()}",
        "python": platform.python_version(),
        "minutes": args.minutes,
        "warmup_seconds": args.warmup_seconds,
        "rate_scraps_per_s": args.rate,
        "rate_jobs_per_s": args.rate * JOBS_PER_SCRAP,
        "users": args.users,
        "rate_limiter": not args.no_rate_limit,
        "load_at_start": "{:.1f}/{:.1f}".format(*os.getloadavg()[:2]),
    }
    with infra.postgres_server() as server, infra.rabbitmq_server() as amqp_url:
        database_url = await _create_database(server)
        env = {
            "DATABASE_URL": database_url,
            "AMQP_URL": amqp_url,
            "AMQP_PREFIX": prefix,
            "AUTH_JWT_SECRET": SECRET,
            "TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS,
            "API_HOST": "127.0.0.1",
            "API_PORT": str(infra.free_port()),
            "AI_PROVIDER": "local",
            "SAN_ENV": "development",
            "LOG_FORMAT": "json",
            "DATA_DIR": str(ROOT / ".bench" / "soak-data"),
        }
        if args.no_rate_limit:
            env["RATE_LIMIT_ENABLED"] = "false"
        stack = Stack(env, log_dir)
        db = await asyncpg.connect(database_url)
        samples: list[dict[str, Any]] = []
        stop_sampling = asyncio.Event()
        load = Load()
        try:
            stack.start()
            await stack.wait_ready()
            base_url = f"http://127.0.0.1:{env['API_PORT']}"
            tokens = [mint(SECRET, f"soak-user-{i:04d}") for i in range(args.users)]
            print(f"soak: services ready; warm-up {args.warmup_seconds:.0f}s", flush=True)
            # The warm-up's load runs on into the soak without a gap: one schedule.
            soak_start = time.monotonic() + args.warmup_seconds
            soak_end = soak_start + args.minutes * 60
            sampling = asyncio.create_task(
                sampler(stack, db, load, soak_start, args.sample_seconds, samples, stop_sampling)
            )
            wall_start = time.time() + args.warmup_seconds
            await drive(base_url, tokens, args.rate, soak_end, args.max_in_flight, load, args.seed)
            stop_sampling.set()
            await sampling
            end = await sample(stack, db, time.monotonic() - soak_start, load)
            samples.append(end)
            hwm = {name: tree_kb(p.pid, "VmHWM") for name, p in stack.processes.items()}
            # After the load: how long the backlog takes to clear (bounded).
            drained_after: float | None = None
            drain_began = time.monotonic()
            while time.monotonic() - drain_began < args.drain_seconds:
                row = await db.fetchrow(_PROGRESS)
                if row["active"] == 0 and row["unpublished"] == 0:
                    drained_after = time.monotonic() - drain_began
                    break
                await asyncio.sleep(0.5)
            latencies = await _job_latencies(db, wall_start, wall_start + args.minutes * 60)
            report["exited"] = stack.exited()
        finally:
            stop_sampling.set()
            stack.stop()
            await db.close()
            await _drop_topology(amqp_url, prefix)
    report["load_at_end"] = "{:.1f}/{:.1f}".format(*os.getloadavg()[:2])
    report["samples"] = samples
    report["peak_vmhwm_mb"] = {
        n: None if kb is None else round(kb / 1024, 1) for n, kb in hwm.items()
    }
    soak = [s for s in samples if s["t"] >= 0]
    report["services"] = {
        name: trend(
            [(s["t"], s["rss_mb"][name]) for s in soak if s["rss_mb"][name] is not None],
            args.minutes,
        )
        for name in SERVICES
    }
    first = soak[0] if soak else samples[0]
    seconds = max(1e-9, end["t"] - first["t"])
    created = end["jobs"] - first["jobs"]
    completed = end["completed"] - first["completed"]
    backlog = [(s["t"], float(s["active"] + s["unpublished"])) for s in soak]
    backlog_slope = slope_per_minute([p for p in backlog if p[0] >= end["t"] / 2])
    offered = args.rate * JOBS_PER_SCRAP
    kept_up = (
        load.skipped == 0
        and load.refused == 0
        and load.errors == 0
        and end["active"] <= 5 * offered
        and completed >= 0.95 * created
    )
    report["jobs"] = {
        "created_during_soak": created,
        "completed_during_soak": completed,
        "created_per_s": created / seconds,
        "completed_per_s": completed / seconds,
        "completed_total": end["completed"],
        "failed_total": end["failed"],
        "active_at_end": end["active"],
        "unpublished_at_end": end["unpublished"],
        "backlog_slope_second_half_per_min": backlog_slope,
        "drained_after_s": drained_after,
        "enqueue_to_done": latencies,
        "kept_up": kept_up,
    }
    report["requests"] = {
        **load.counts(),
        "statuses": load.statuses,
        "p50_ms": statistics.median(load.latencies_ms) if load.latencies_ms else None,
        "p99_ms": percentile(load.latencies_ms, 0.99) if load.latencies_ms else None,
    }
    return report


def _mb(value: float | None, digits: int = 0, sign: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+,.{digits}f}" if sign else f"{value:,.{digits}f}"


def render(report: dict[str, Any]) -> str:
    jobs, requests = report["jobs"], report["requests"]
    limiter = "on" if report["rate_limiter"] else "off (RATE_LIMIT_ENABLED=false)"
    lines = [
        f"### `make soak` — {report['date']}",
        f"Machine: {report['machine']}, Python {report['python']}; load average (1/5 min) "
        f"{report['load_at_start']} at start, {report['load_at_end']} at end. Load: "
        f"{report['rate_scraps_per_s']:g} `POST /scraps`/s = {report['rate_jobs_per_s']:g} "
        f"jobs/s (CARD_ANALYSIS + SCRAP_REFINE) from {report['users']} users, rate limiter "
        f"{limiter}; {report['warmup_seconds']:g} s warm-up, then {report['minutes']:g} min.",
        "",
        "| service | RSS at start (MB) | peak (MB) | end (MB) | peak VmHWM (MB) "
        "| slope, 2nd half (MB/min) | slope, whole soak (MB/min) | trend |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in SERVICES:
        s = report["services"].get(name) or {}
        lines.append(
            f"| san-{name} | {_mb(s.get('start_mb'), 1)} | {_mb(s.get('peak_mb'), 1)} "
            f"| {_mb(s.get('end_mb'), 1)} | {_mb(report['peak_vmhwm_mb'].get(name), 1)} "
            f"| {_mb(s.get('slope_second_half_mb_per_min'), 2, sign=True)} "
            f"| {_mb(s.get('slope_all_mb_per_min'), 2, sign=True)} | {s.get('verdict', '—')} |"
        )
    latency = jobs["enqueue_to_done"]
    drained = (
        f"cleared {jobs['drained_after_s']:.0f} s after the load stopped"
        if jobs["drained_after_s"] is not None
        else "not cleared within the drain wait"
    )
    lines += [
        "",
        "| jobs and requests over the soak | |",
        "|---|---|",
        f"| jobs created / completed | {jobs['created_during_soak']:,} / "
        f"{jobs['completed_during_soak']:,} ({jobs['created_per_s']:,.1f} / "
        f"{jobs['completed_per_s']:,.1f} per s) |",
        f"| enqueue→done p50 / p99 (completed jobs created in the soak) "
        f"| {_mb(latency['p50_ms'])} / {_mb(latency['p99_ms'])} ms |",
        f"| backlog at the end: jobs PENDING/PROCESSING, outbox unpublished "
        f"| {jobs['active_at_end']:,}, {jobs['unpublished_at_end']:,} ({drained}) |",
        f"| backlog slope, 2nd half (jobs/min) "
        f"| {_mb(jobs['backlog_slope_second_half_per_min'], 1, sign=True)} |",
        f"| jobs FAILED (whole run) | {jobs['failed_total']:,} |",
        f"| `POST /scraps`: sent, accepted, refused (429), errors, skipped (client cap) "
        f"| {requests['sent']:,}, {requests['accepted']:,}, {requests['refused']:,}, "
        f"{requests['errors']:,}, {requests['skipped']:,} |",
        f"| `POST /scraps` p50 / p99 | {_mb(requests['p50_ms'], 1)} / "
        f"{_mb(requests['p99_ms'], 1)} ms |",
        f"| kept up (no refusals or errors, backlog ≤ 5 s of load, completed ≥ 95 % of "
        f"created) | {'yes' if jobs['kept_up'] else 'no'} |",
    ]
    if report.get("exited"):
        lines.append(f"| services that exited during the run | {', '.join(report['exited'])} |")
    lines += ["", _per_minute(report)]
    return "\n".join(lines) + "\n"


def _nearest(samples: Sequence[dict[str, Any]], t: float) -> dict[str, Any]:
    return min(samples, key=lambda s: abs(float(s["t"]) - t))


def _per_minute(report: dict[str, Any]) -> str:
    """RSS (MB) of each service at each whole minute of the soak (nearest sample)."""
    soak = [s for s in report["samples"] if s["t"] >= 0]
    if not soak:
        return ""
    minutes = range(int(soak[-1]["t"] // 60) + 1)
    picks = [_nearest(soak, 60.0 * m) for m in minutes]
    lines = [
        "| RSS (MB) at minute | " + " | ".join(str(m) for m in minutes) + " |",
        "|---|" + "---|" * len(picks),
    ]
    for name in SERVICES:
        cells = (_mb(s["rss_mb"].get(name), 0) for s in picks)
        lines.append(f"| san-{name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="make soak", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="the soak, after warm-up")
    parser.add_argument("--warmup-seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=50.0, help="POST /scraps per second")
    parser.add_argument("--users", type=int, default=200, help="users the requests rotate over")
    parser.add_argument("--no-rate-limit", action="store_true", help="RATE_LIMIT_ENABLED=false")
    parser.add_argument("--sample-seconds", type=float, default=5.0)
    parser.add_argument("--max-in-flight", type=int, default=64)
    parser.add_argument("--drain-seconds", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="soak", help="results file name (benchmarks/results/)")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    rendered = render(report)
    print("\n" + rendered)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.md").write_text(rendered)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
