"""What every system's benchmark driver shares: the no-op job's table, the three
scenarios, and the figures computed from the database afterwards.

Runs in both virtual environments (SAN's and the peers'), so it needs only the standard
library and asyncpg. A driver supplies these (see `Driver`): prepare its schema,
start its worker as an OS process of its own, enqueue one job, name its other processes,
and stop the worker.

The no-op job of every system does the same thing: one `UPDATE bench_rows` that records
when the job started (the worker's clock at the job function's entry) and when it wrote
(`clock_timestamp()`). Enqueue times are taken by the driver just before each enqueue
call. All clocks are this machine's one wall clock, so the differences are latencies.
Every scenario also reports the CPU each job cost each process (the driver, the worker,
SAN's relay, PostgreSQL, RabbitMQ), read from /proc around the measured window: the
paced one shows what a job costs at a low rate, where batches hold one job and idle
time's timers are shared by few.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import asyncpg

BENCH_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS bench_rows (
    id uuid PRIMARY KEY,
    started_at timestamptz,
    done_at timestamptz
)
"""

# The one statement of every system's no-op job ($1 = id, $2 = epoch seconds at entry).
NOOP_UPDATE = (
    "UPDATE bench_rows SET started_at = to_timestamp($2), done_at = clock_timestamp() WHERE id = $1"
)
# The same for DB-API drivers (psycopg): positional `%s` placeholders.
NOOP_UPDATE_PSYCOPG = (
    "UPDATE bench_rows SET started_at = to_timestamp(%s), done_at = clock_timestamp() WHERE id = %s"
)

SCENARIOS = ("drain", "burst", "paced")


class Driver(Protocol):
    async def prepare(self, connection: asyncpg.Connection) -> None:
        """Create (or empty) the system's own tables/queues for a clean run."""

    def start_worker(self) -> subprocess.Popen[bytes]:
        """Start one worker process of the system, consuming the benchmark's queue."""

    async def enqueue(self, row_id: uuid.UUID) -> None:
        """Enqueue one no-op job for `row_id`, the way the system's users do."""

    async def settle_backlog(self, connection: asyncpg.Connection) -> None:
        """Drain scenario: wait until the enqueued jobs are where the worker takes them
        from (SAN: published by the relay); nothing to do for the others."""

    def side_processes(self) -> dict[str, list[int]]:
        """The system's processes besides its worker that a job costs CPU in, by name
        (SAN: the relay); the CPU per job counts them."""

    async def close(self) -> None:
        """Release the enqueuer's connections."""

    def worker_main(self) -> None:
        """The body of the worker process (`python -m … worker`)."""


@dataclass
class Outcome:
    scenario: str
    jobs: int
    rate: float | None = None  # jobs/s
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    extra: dict[str, float] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def _insert_rows(connection: asyncpg.Connection, n: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    await connection.copy_records_to_table(
        "bench_rows", records=[(i,) for i in ids], columns=["id"]
    )
    return ids


async def _wait_done(
    connection: asyncpg.Connection,
    ids: Sequence[uuid.UUID],
    timeout: float,
    worker: subprocess.Popen[bytes] | None = None,
) -> None:
    """Until every one of `ids` is done. Every system runs its jobs about in the order they
    were enqueued, so the poll reads the last one's row alone (one index probe) and counts
    them all only once it is done. Counting all of them every poll cost the database ~2 ms
    of CPU a poll at 2,000 ids, ~10 % of a core taken from the system under test (a whole
    core at 20,000)."""
    deadline = time.monotonic() + timeout
    while True:
        if worker is not None and worker.poll() is not None:
            raise RuntimeError(f"the worker process exited with {worker.returncode}; see its log")
        if await connection.fetchval(_LAST_DONE, ids[-1]):
            done = await connection.fetchval(_COUNT_DONE, list(ids))
            if done == len(ids):
                return
        if time.monotonic() > deadline:
            done = await connection.fetchval(_COUNT_DONE, list(ids))
            raise TimeoutError(f"only {done} of {len(ids)} jobs done after {timeout:.0f}s")
        await asyncio.sleep(0.02)


_LAST_DONE = "SELECT done_at IS NOT NULL FROM bench_rows WHERE id = $1"
_COUNT_DONE = "SELECT count(*) FROM bench_rows WHERE id = ANY($1) AND done_at IS NOT NULL"


async def _times(
    connection: asyncpg.Connection, ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, tuple[float, float]]:
    rows = await connection.fetch(
        "SELECT id, extract(epoch FROM started_at)::float8 AS s,"
        " extract(epoch FROM done_at)::float8 AS d FROM bench_rows WHERE id = ANY($1)",
        list(ids),
    )
    return {row["id"]: (row["s"], row["d"]) for row in rows}


async def _warm_up(
    driver: Driver, connection: asyncpg.Connection, worker: subprocess.Popen[bytes]
) -> None:
    """One job end to end: the worker (and whatever sits between) is connected."""
    (row,) = await _insert_rows(connection, 1)
    await driver.enqueue(row)
    await _wait_done(connection, [row], timeout=180, worker=worker)


async def _wait_first(
    connection: asyncpg.Connection,
    ids: Sequence[uuid.UUID],
    timeout: float,
    worker: subprocess.Popen[bytes] | None = None,
) -> int:
    """Until at least one of `ids` is done; how many are."""
    deadline = time.monotonic() + timeout
    while True:
        if worker is not None and worker.poll() is not None:
            raise RuntimeError(f"the worker process exited with {worker.returncode}; see its log")
        # Only this scenario's rows are in the table (truncated first): no id list to read.
        if await connection.fetchval(
            "SELECT EXISTS (SELECT FROM bench_rows WHERE done_at IS NOT NULL)"
        ):
            return int(await connection.fetchval(_COUNT_DONE, list(ids)))
        if time.monotonic() > deadline:
            raise TimeoutError(f"no job done after {timeout:.0f}s")
        await asyncio.sleep(0.005)


async def _cpu_parts(
    driver: Driver, connection: asyncpg.Connection, worker: subprocess.Popen[bytes]
) -> dict[str, list[int]]:
    """The processes whose CPU a job costs, by part: the worker, the system's other
    processes (SAN's relay), PostgreSQL and RabbitMQ. The driver (enqueuing, and polling
    like every system's) is counted apart, by `_cpu_now`."""
    return {"worker": [worker.pid], **driver.side_processes(), **(await server_pids(connection))}


def _cpu_now(parts: dict[str, list[int]]) -> dict[str, float]:
    return {"driver": time.process_time(), **cpu_snapshot(parts)}


def stop_process(
    process: subprocess.Popen[bytes], timeout: float = 30.0, name: str | None = None
) -> None:
    """SIGTERM, then SIGKILL after `timeout`; its peak RSS is recorded first (under `name`,
    else `process_name`)."""
    if process.poll() is None:
        record_peak_rss(process, name)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def run_scenario(
    driver: Driver, database_url: str, scenario: str, n: int, rate: float, seconds: float
) -> Outcome:
    connection = await asyncpg.connect(database_url)
    worker: subprocess.Popen[bytes] | None = None
    try:
        await connection.execute(BENCH_TABLE_DDL)
        await connection.execute("TRUNCATE bench_rows")
        await driver.prepare(connection)
        if scenario == "drain":
            ids = await _insert_rows(connection, n)
            for row in ids:
                await driver.enqueue(row)
            # Whatever a system does before its worker sees the jobs (SAN's relay) is done.
            await driver.settle_backlog(connection)
            worker = driver.start_worker()
            # CPU is counted from the first job done: the worker's start-up is not a job's
            early = await _wait_first(connection, ids, timeout=600, worker=worker)
            parts = await _cpu_parts(driver, connection, worker)
            before = _cpu_now(parts)
            await _wait_done(connection, ids, timeout=600, worker=worker)
            cpu = cpu_per_job(before, _cpu_now(parts), n - early)
            times = await _times(connection, ids)
            first = min(s for s, _ in times.values())
            last = max(d for _, d in times.values())
            return Outcome(scenario, n, rate=(n - 1) / max(last - first, 1e-9), extra=cpu)
        worker = driver.start_worker()
        await _warm_up(driver, connection, worker)
        if scenario == "burst":
            ids = await _insert_rows(connection, n)
            parts = await _cpu_parts(driver, connection, worker)
            before = _cpu_now(parts)
            enqueued: dict[uuid.UUID, float] = {}
            for row in ids:
                enqueued[row] = time.time()
                await driver.enqueue(row)
            enqueue_seconds = time.time() - enqueued[ids[0]]
            await _wait_done(connection, ids, timeout=600, worker=worker)
            cpu = cpu_per_job(before, _cpu_now(parts), n)
            times = await _times(connection, ids)
            last = max(d for _, d in times.values())
            latencies = [(times[i][1] - enqueued[i]) * 1000 for i in ids]
            return Outcome(
                scenario,
                n,
                rate=n / max(last - enqueued[ids[0]], 1e-9),
                latency_p50_ms=percentile(latencies, 0.5),
                latency_p99_ms=percentile(latencies, 0.99),
                extra={"enqueue_rate": n / max(enqueue_seconds, 1e-9), **cpu},
            )
        if scenario == "paced":
            count = max(1, int(rate * seconds))
            ids = await _insert_rows(connection, count)
            # CPU per job at this rate: what idle time costs (timers, heartbeats, polls) is
            # spread over fewer jobs, and batches are smaller than in a burst.
            parts = await _cpu_parts(driver, connection, worker)
            before = _cpu_now(parts)
            enqueued = {}
            began = time.monotonic()
            for k, row in enumerate(ids):
                # a fixed schedule, so a slow enqueue does not shift the later ones
                await asyncio.sleep(max(0.0, began + k / rate - time.monotonic()))
                enqueued[row] = time.time()
                await driver.enqueue(row)
            await _wait_done(connection, ids, timeout=180, worker=worker)
            cpu = cpu_per_job(before, _cpu_now(parts), count)
            times = await _times(connection, ids)
            latencies = [(times[i][0] - enqueued[i]) * 1000 for i in ids]
            return Outcome(
                scenario,
                count,
                latency_p50_ms=percentile(latencies, 0.5),
                latency_p99_ms=percentile(latencies, 0.99),
                extra=cpu,
            )
        raise ValueError(f"unknown scenario {scenario}")
    finally:
        if worker is not None:
            stop_process(worker, name="worker")
        await driver.close()
        await connection.close()


def cli(build: type) -> None:  # type: ignore[type-arg]
    """`python -m benchmarks.peers.X drive|worker …`: one JSON line on stdout for `drive`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["drive", "worker"])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--amqp-url", required=True)
    parser.add_argument("--scenario", choices=SCENARIOS, default="drain")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    driver = build(args.database_url, args.amqp_url)
    if args.command == "worker":
        driver.worker_main()
        return
    outcome = asyncio.run(
        run_scenario(driver, args.database_url, args.scenario, args.jobs, args.rate, args.seconds)
    )
    outcome.extra.update({f"{PEAK_RSS_PREFIX}{n}": mb for n, mb in PEAK_RSS_MB.items()})
    print(json.dumps(outcome.__dict__))


def worker_command(module: str, database_url: str, amqp_url: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        module,
        "worker",
        "--database-url",
        database_url,
        "--amqp-url",
        amqp_url,
    ]


def spawn(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A worker process; its own output goes to a log file, not into the driver's JSON."""
    log_dir = os.environ.get("BENCH_LOG_DIR", "/tmp")
    log = open(os.path.join(log_dir, f"{process_name(command)}.log"), "ab")
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )


def median_summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# --- peak RSS, read from outside the process (/proc; Linux) -------------------------------

# The peak RSS (VmHWM, MB) of each process `stop_process` stopped, by name ("worker" for
# the worker of `run_scenario`, else `process_name`: "san-relay"); `cli`
# adds them to the driver's outcome as `peak_rss_mb:<name>` (maximum over the driver's
# processes of that name) and run.py reports them. Read just before SIGTERM, so a
# process's whole life is covered.
PEAK_RSS_MB: dict[str, float] = {}
PEAK_RSS_PREFIX = "peak_rss_mb:"


def process_name(command: Sequence[str]) -> str:
    """`python -m X …` → X; `/path/san-relay` → san-relay (also the log file's name)."""
    return os.path.basename(command[2] if list(command[1:2]) == ["-m"] else command[0])


def _status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:  # gone, or no /proc here
        return None
    return None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # the command name (field 2) may hold spaces: the parent follows its ')'
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tree_kb(pid: int, key: str = "VmRSS") -> int | None:
    """`key` of /proc/<pid>/status (VmRSS: resident now; VmHWM: its peak) of a process
    plus its descendants (a Dramatiq worker's child processes), in kB; None when gone."""
    own = _status_kb(pid, key)
    if own is None:
        return None
    return own + sum(_status_kb(child, key) or 0 for child in _descendants(pid))


def record_peak_rss(process: subprocess.Popen[bytes], name: str | None = None) -> None:
    kb = tree_kb(process.pid, "VmHWM")
    if kb is None:
        return
    if name is None:
        args = process.args
        name = process_name([str(a) for a in args] if isinstance(args, list) else [str(args)])
    PEAK_RSS_MB[name] = max(PEAK_RSS_MB.get(name, 0.0), round(kb / 1024, 1))


# --- CPU per job, read from outside the processes (/proc; Linux) ---------------------------

# Throughput on a shared 2-core machine moves by half between runs; the CPU a job costs
# each process hardly does, and it says where a system spends it. `run_scenario` reads
# these around the drain's and the burst's measured window and reports them in the
# outcome as `cpu_ms_per_job:<part>`.
CPU_PREFIX = "cpu_ms_per_job:"


def _cpu_fields(pid: int) -> tuple[float, float] | None:
    """(utime + stime, cutime + cstime) of a process in seconds: its own CPU and that of
    its children it has reaped (a PostgreSQL backend that exited, a worker child)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    # fields after the command name start at field 3 (state): utime is field 14
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of a process and every descendant, alive or reaped; None when gone."""
    own = _cpu_fields(pid)
    if own is None:
        return None
    total = own[0] + own[1]
    for child in _descendants(pid):
        got = _cpu_fields(child)
        if got is not None:  # an exited child is in its parent's reaped time
            total += got[0] + got[1]
    return total


def processes_named(comm: str) -> list[int]:
    """Pids whose command name (/proc/<pid>/comm) is `comm` (RabbitMQ's `beam.smp`)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as name:
                    if name.read().strip() == comm:
                        found.append(int(entry))
            except OSError:
                continue
    return found


async def server_pids(connection: asyncpg.Connection) -> dict[str, list[int]]:
    """The servers every system shares, when they run on this machine: PostgreSQL (the
    postmaster of the driver's own backend) and RabbitMQ (every `beam.smp`)."""
    backend = await connection.fetchval("SELECT pg_backend_pid()")
    pids: dict[str, list[int]] = {"RabbitMQ": processes_named("beam.smp")}
    postmaster = _parent(backend)
    if postmaster is not None:  # else not on this machine (a container, another host)
        pids["PostgreSQL"] = [postmaster]
    return pids


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def cpu_snapshot(parts: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds of each part (its processes' trees) now; parts that are gone are left
    out."""
    snapshot = {}
    for name, pids in parts.items():
        seconds = [tree_cpu_seconds(pid) for pid in pids]
        if pids and all(s is not None for s in seconds):
            snapshot[name] = sum(s for s in seconds if s is not None)
    return snapshot


def cpu_per_job(before: dict[str, float], after: dict[str, float], jobs: int) -> dict[str, float]:
    """`cpu_ms_per_job:<part>` for each part read at both ends, plus `all`."""
    spent = {name: after[name] - before[name] for name in before if name in after}
    if jobs <= 0 or not spent:
        return {}
    per_job = {f"{CPU_PREFIX}{name}": round(s * 1000 / jobs, 3) for name, s in spent.items()}
    per_job[f"{CPU_PREFIX}all"] = round(sum(spent.values()) * 1000 / jobs, 3)
    return per_job
