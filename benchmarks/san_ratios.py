"""SAN's own ratios of `make bench`, each against a baseline measured in the same run,
alternating A B A B A B:

- API: `POST /scraps` (the real `san-api` process, rate limiter off: RATE_LIMIT_ENABLED=
  false — the benchmark is one user hammering one endpoint) against benchmarks/bare_api.py
  (FastAPI + asyncpg, the same transaction), at c=16 and c=64, load from
  benchmarks/loadgen.py in a process of its own; and, reported beside them, a second
  `san-api` with the limits on as deployed (token bucket and active-job cap; their sizes
  raised so nobody is refused), its requests spread over `LIMITED_USERS` users; the CPU
  each server process spent per request, read from /proc, beside the rates;
- relay: a real `san-relay` process publishing N committed outbox rows against
  benchmarks/raw_publisher.py (100 confirms in flight, same quorum queue, same envelope),
  timed from the commit of the rows until the last is marked published;
- similar cards at `--cards` cards of one user (clustered, benchmarks/cards_data.py):
  the SQL forced onto the HNSW index, the exact scan, and `GET /cards/{id}/similar-cards`
  through the real API; recall@10 of the API's answers against the exact scan; and
  whether the index served them (pg_stat_user_indexes).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx

from benchmarks import cards_data
from benchmarks.peers.common import percentile, spawn, stop_process, tree_cpu_seconds
from san_api.auth.tokens import mint
from san_common.broker.topology import Topology, declare_topology
from san_common.db.migrate import upgrade
from san_common.jobs.types import JobType
from tests import infra

SECRET = "bench-secret-" + "x" * 40
TOKEN_KEYS = "JqSQtt2DE8ApEO7q32BRyUIvVvRANJ0fPxXRu7AQrSA"
VENV_BIN = Path(sys.executable).parent


# The limits-on run's users: the active-job cap locks each user's requests one after the
# other, so one user hammering measures that lock, not the endpoint.
LIMITED_USERS = 200


def _api_env(
    database_url: str, amqp_url: str, port: int, *, limits: bool = False
) -> dict[str, str]:
    env = {
        "DATABASE_URL": database_url,
        "AMQP_URL": amqp_url,
        "AUTH_JWT_SECRET": SECRET,
        "TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS,
        "API_PORT": str(port),
        "SAN_ENV": "development",
        "DATA_DIR": os.environ.get("BENCH_LOG_DIR", "/tmp"),
        "RATE_LIMIT_ENABLED": "false",
    }
    if limits:  # on, but never refusing: their cost is measured, not their refusals
        env.update(
            RATE_LIMIT_ENABLED="true",
            RATE_LIMIT_JOBS_BURST="1000000",
            RATE_LIMIT_JOBS_PER_MINUTE="100000000",
            ACTIVE_JOBS_MAX_PER_USER="100000000",
        )
    return env


async def _wait_http(url: str, process: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{url}: the server exited with {process.returncode}")
            try:
                if (await client.get(url, timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def _start_api(
    database_url: str, amqp_url: str, *, limits: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    port = infra.free_port()
    env = _api_env(database_url, amqp_url, port, limits=limits)
    process = spawn([str(VENV_BIN / "san-api")], env=env)
    return process, f"http://127.0.0.1:{port}"


def bare_command(port: int) -> list[str]:
    """The bare endpoint's server on `port` (its environment: `bare_env`)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "benchmarks.bare_api:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]


def bare_env(database_url: str) -> dict[str, str]:
    return {"BENCH_DATABASE_URL": database_url, "BENCH_JWT_SECRET": SECRET}


def _start_bare(database_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = infra.free_port()
    process = spawn(bare_command(port), env=bare_env(database_url))
    return process, f"http://127.0.0.1:{port}"


def _loadgen(url: str, *extra: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.loadgen", "--url", url, *extra],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def _migrated(server: str, name: str) -> str:
    from benchmarks.run import create_database

    url = await create_database(server, name)
    await asyncio.to_thread(upgrade, url)
    return url


async def api_ratios(server: str, amqp_url: str, runs: int, seconds: float) -> dict[str, Any]:
    database_url = await _migrated(server, "bench_api")
    san, san_url = _start_api(database_url, amqp_url)
    limited, limited_url = _start_api(database_url, amqp_url, limits=True)
    bare, bare_url = _start_bare(database_url)
    results: dict[str, list[dict[str, Any]]] = {}
    run_id = uuid.uuid4().hex
    many_users = Path(os.environ.get("BENCH_LOG_DIR", "/tmp")) / f"bench-users-{run_id}"
    try:
        await _wait_http(f"{san_url}/healthz", san)
        await _wait_http(f"{limited_url}/healthz", limited)
        await _wait_http(f"{bare_url}/docs", bare)
        one_user = f"Authorization: Bearer {mint(SECRET, 'bench-api-' + run_id)}"
        many_users.write_text(
            "".join(
                f"Authorization: Bearer {mint(SECRET, f'bench-api-{run_id}-{i}')}\n"
                for i in range(LIMITED_USERS)
            )
        )
        systems = (
            ("san", san, san_url, ("--header", one_user)),
            ("bare", bare, bare_url, ("--header", one_user)),
            ("limited", limited, limited_url, ("--cycle-header", str(many_users))),
        )
        for _ in range(runs):
            for concurrency in (16, 64):
                for name, server_process, url, users in systems:
                    cpu_before = tree_cpu_seconds(server_process.pid)
                    outcome = _loadgen(
                        url,
                        "--path",
                        "/scraps",
                        "--method",
                        "POST",
                        "--body",
                        '{"content": "bench scrap {n} {run}"}',
                        *users,
                        "-c",
                        str(concurrency),
                        "--seconds",
                        str(seconds),
                    )
                    cpu_after = tree_cpu_seconds(server_process.pid)
                    if cpu_before is not None and cpu_after is not None and outcome["requests"]:
                        # the figure the machine's noise hardly moves, unlike the rate
                        outcome["cpu_ms_per_request"] = round(
                            (cpu_after - cpu_before) * 1000 / outcome["requests"], 3
                        )
                    results.setdefault(f"{name}_c{concurrency}", []).append(outcome)
                    print(f"api {name} c={concurrency} {outcome}", flush=True)
    finally:
        stop_process(san)
        stop_process(limited)
        stop_process(bare)
        many_users.unlink(missing_ok=True)
    return results


async def relay_ratios(
    server: str, amqp_url: str, runs: int, messages: int, prefix: str
) -> dict[str, Any]:
    database_url = await _migrated(server, "bench_relay")
    topology = Topology(prefix=prefix)
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    for name in topology.all_queue_names():  # left by an interrupted run, maybe of an
        await channel.queue_delete(name)  # older version with other queue arguments
    queues = await declare_topology(channel, topology)
    queue = queues[JobType.CARD_ANALYSIS]
    db = await asyncpg.connect(database_url)
    relay = spawn(
        [str(VENV_BIN / "san-relay")],
        env={
            "DATABASE_URL": database_url,
            "AMQP_URL": amqp_url,
            "AMQP_PREFIX": topology.prefix,
            "SAN_ENV": "development",
            "DATA_DIR": os.environ.get("BENCH_LOG_DIR", "/tmp"),
        },
    )
    results: dict[str, list[float]] = {"raw": [], "relay": []}
    insert = """
        INSERT INTO outbox_messages (message_id, exchange, routing_key, body)
        SELECT m, 'jobs', 'CARD_ANALYSIS', jsonb_build_object(
            'version', 1, 'message_id', m, 'job_id', gen_random_uuid(),
            'job_type', 'CARD_ANALYSIS', 'target_id', gen_random_uuid(),
            'user_id', gen_random_uuid(), 'attempt', 1, 'created_at', now(),
            'traceparent', NULL, 'tracestate', NULL)
        FROM (SELECT gen_random_uuid() AS m FROM generate_series(1, $1)) AS g
    """
    unpublished = "SELECT count(*) FROM outbox_messages WHERE published_at IS NULL"
    try:
        await db.execute(insert, 1)  # warm-up: the relay is connected once this is out
        deadline = time.monotonic() + 180
        while await db.fetchval(unpublished):
            if time.monotonic() > deadline or relay.poll() is not None:
                raise RuntimeError("the relay did not publish its warm-up row")
            await asyncio.sleep(0.05)
        for _ in range(runs):
            done = await asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable,
                    "-m",
                    "benchmarks.raw_publisher",
                    "--amqp-url",
                    amqp_url,
                    "--exchange",
                    topology.jobs_exchange,
                    "--routing-key",
                    "CARD_ANALYSIS",
                    "--messages",
                    str(messages),
                    "--window",
                    "100",
                ],
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            )
            results["raw"].append(json.loads(done.stdout.strip().splitlines()[-1])["rate"])
            await queue.purge()
            await db.execute(insert, messages)  # one commit, one NOTIFY
            # From the commit, when the rows exist for the relay: writing them is not its work
            started = time.perf_counter()
            while await db.fetchval(unpublished):
                await asyncio.sleep(0.01)
            results["relay"].append(messages / (time.perf_counter() - started))
            await queue.purge()
            print(
                f"relay raw {results['raw'][-1]:.0f} relay {results['relay'][-1]:.0f}", flush=True
            )
    finally:
        stop_process(relay)
        await db.close()
        for name in topology.all_queue_names():
            await channel.queue_delete(name)
        await channel.exchange_delete(topology.jobs_exchange)
        await channel.exchange_delete(topology.dead_letter_exchange)
        await connection.close()
    return results


_EXACT = """
    SELECT id FROM knowledge_cards
    WHERE user_id = $2 AND id <> $1
    ORDER BY (embedding <=> (SELECT embedding FROM knowledge_cards WHERE id = $1)) + 0
    LIMIT 10
"""
_FORCED = """
    SELECT id FROM knowledge_cards
    WHERE user_id = $2 AND id <> $1
    ORDER BY embedding <=> (SELECT embedding FROM knowledge_cards WHERE id = $1)
    LIMIT 10
"""


async def similar_ratios(
    server: str, amqp_url: str, cards: int, queries: int, seconds: float
) -> dict[str, Any]:
    database_url = await _migrated(server, "bench_cards")
    db = await asyncpg.connect(database_url)
    started = time.monotonic()
    build_seconds = await cards_data.fill(db, "bench-cards", cards)
    fill_seconds = time.monotonic() - started
    user_id = await db.fetchval("SELECT id FROM users WHERE external_id = 'bench-cards'")
    ids = [
        r[0]
        for r in await db.fetch(
            "SELECT id FROM knowledge_cards ORDER BY random() LIMIT $1", queries
        )
    ]
    exact: dict[uuid.UUID, list[uuid.UUID]] = {}
    exact_ms: list[float] = []
    for card in ids:
        t = time.perf_counter()
        exact[card] = [r[0] for r in await db.fetch(_EXACT, card, user_id)]
        exact_ms.append((time.perf_counter() - t) * 1000)
    forced_ms: list[float] = []
    sql_recall: list[float] = []
    async with db.transaction():
        search = await cards_data.search_settings(db)
        for _ in range(3):
            for card in ids:
                t = time.perf_counter()
                got = [r[0] for r in await db.fetch(_FORCED, card, user_id)]
                forced_ms.append((time.perf_counter() - t) * 1000)
                sql_recall.append(len(set(got) & set(exact[card])) / 10)
    index_scans = (
        "SELECT idx_scan FROM pg_stat_user_indexes"
        " WHERE indexrelname = 'ix_knowledge_cards_embedding_hnsw'"
    )
    scans_before = await db.fetchval(index_scans)
    api, api_url = _start_api(database_url, amqp_url)
    try:
        await _wait_http(f"{api_url}/healthz", api)
        token = mint(SECRET, "bench-cards")
        headers = {"Authorization": f"Bearer {token}"}
        api_recall: list[float] = []
        async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=60) as client:
            for card in ids:
                body = (await client.get(f"/cards/{card}/similar-cards?limit=10")).json()
                got = {uuid.UUID(c["cardId"]) for c in body["cards"]}
                # the API answers the cards within the threshold, else the K nearest
                expected = set(exact[card][: len(got)]) if got else set(exact[card])
                api_recall.append(len(got & expected) / max(1, len(expected)))
        paths = Path(os.environ.get("BENCH_LOG_DIR", "/tmp")) / "similar-paths.txt"
        paths.write_text("\n".join(f"/cards/{c}/similar-cards" for c in ids))
        served = _loadgen(
            api_url,
            "--paths",
            str(paths),
            "--header",
            f"Authorization: Bearer {token}",
            "-c",
            "1",
            "--seconds",
            str(seconds),
        )
        await asyncio.sleep(1.5)  # the server's statistics reach pg_stat_* within a second
        scans_after = await db.fetchval(index_scans)
    finally:
        stop_process(api)
        await db.close()
    forced_sorted = sorted(forced_ms)
    return {
        "cards": cards,
        "fill_seconds": round(fill_seconds, 1),
        "index_build_seconds": round(build_seconds, 1),
        "ef_search": int(search["hnsw.ef_search"]),
        "exact_p50_ms": statistics.median(exact_ms),
        "exact_p99_ms": percentile(exact_ms, 0.99),
        "forced_sql_p50_ms": statistics.median(forced_sorted),
        "forced_sql_p99_ms": percentile(forced_sorted, 0.99),
        "sql_recall_at_10": statistics.mean(sql_recall),
        "api_recall_at_10": statistics.mean(api_recall),
        "api": served,
        "api_index_scans": scans_after - scans_before,
    }


async def run_all(server: str, amqp_url: str, args: Any, extra: dict[str, Any]) -> dict[str, Any]:
    wanted = set(args.only_ratios or ["api", "relay", "similar"])
    ratios: dict[str, Any] = {}
    if "api" in wanted:
        api = await api_ratios(server, amqp_url, args.runs, seconds=5)
        ratios["api"] = api
        for c in (16, 64):
            san = statistics.median(r["rate"] for r in api[f"san_c{c}"])
            bare = statistics.median(r["rate"] for r in api[f"bare_c{c}"])
            extra[f"api_c{c}"] = f"{san / bare:.2f}× ({san:,.0f} vs {bare:,.0f} req/s)"
        for c in (16, 64):  # reported: the server process's CPU per request
            san_runs, bare_runs = (_cpu_per_request(api[f"{n}_c{c}"]) for n in ("san", "bare"))
            if san_runs and bare_runs:
                san_cpu, bare_cpu = statistics.median(san_runs), statistics.median(bare_runs)
                extra[f"api_cpu_c{c}"] = (
                    f"{san_cpu / bare_cpu:.2f}× ({san_cpu:.2f} vs {bare_cpu:.2f} ms a request)"
                )
        san99 = statistics.median(r["p99_ms"] for r in api["san_c64"])
        bare99 = statistics.median(r["p99_ms"] for r in api["bare_c64"])
        extra["api_p99_c64"] = f"{san99 / bare99:.2f}× ({san99:,.0f} vs {bare99:,.0f} ms)"
        for c in (16, 64):  # reported, not an acceptance bar: it does more than the bare one
            limited = statistics.median(r["rate"] for r in api[f"limited_c{c}"])
            bare = statistics.median(r["rate"] for r in api[f"bare_c{c}"])
            extra[f"api_limited_c{c}"] = f"{limited / bare:.2f}× ({limited:,.0f} req/s)"
    if "relay" in wanted:
        relay = await relay_ratios(
            server, amqp_url, args.runs, messages=5000, prefix=args.relay_prefix
        )
        ratios["relay"] = relay
        raw, ours = statistics.median(relay["raw"]), statistics.median(relay["relay"])
        extra["relay"] = f"{ours / raw:.2f}× ({ours:,.0f} vs {raw:,.0f} msg/s)"
    if "similar" in wanted:
        similar = await similar_ratios(server, amqp_url, args.cards, queries=30, seconds=10)
        ratios["similar"] = similar
        api99, sql99 = similar["api"]["p99_ms"], similar["forced_sql_p99_ms"]
        extra["similar_p99"] = f"{api99 / sql99:.2f}× ({api99:.1f} vs {sql99:.1f} ms)"
        extra["similar_recall"] = (
            f"{similar['api_recall_at_10']:.3f} (SQL {similar['sql_recall_at_10']:.3f})"
        )
    return ratios


def _cpu_per_request(rows: list[dict[str, Any]]) -> list[float]:
    """The CPU per request of the runs that measured it (a server gone mid-run did not)."""
    return [r["cpu_ms_per_request"] for r in rows if "cpu_ms_per_request" in r]


def _stat(values: list[float], digits: int = 0) -> str:
    return (
        f"**{statistics.median(values):,.{digits}f}** "
        f"({min(values):,.{digits}f}–{max(values):,.{digits}f})"
    )


def render(ratios: dict[str, Any]) -> str:
    lines: list[str] = []
    if "api" in ratios:
        api = ratios["api"]
        lines += [
            "| API (`POST /scraps`, rate limiter off) | req/s | p50 ms | p99 ms "
            "| server CPU per request (ms) |",
            "|---|---|---|---|---|",
        ]
        for key, label in (
            ("san_c16", "SAN, c=16"),
            ("bare_c16", "bare FastAPI + asyncpg, c=16 (baseline)"),
            ("san_c64", "SAN, c=64"),
            ("bare_c64", "bare FastAPI + asyncpg, c=64 (baseline)"),
            ("limited_c16", f"SAN, limits on, {LIMITED_USERS} users, c=16 (reported)"),
            ("limited_c64", f"SAN, limits on, {LIMITED_USERS} users, c=64 (reported)"),
        ):
            rows = api.get(key)
            if not rows:  # a results file of a version without the row
                continue
            rate, p50, p99 = ([r[k] for r in rows] for k in ("rate", "p50_ms", "p99_ms"))
            cpu = _cpu_per_request(rows)
            lines.append(
                f"| {label} | {_stat(rate)} | {_stat(p50, 1)} | {_stat(p99, 1)} "
                f"| {_stat(cpu, 2) if cpu else '—'} |"
            )
        lines.append("")
    if "relay" in ratios:
        relay = ratios["relay"]
        lines += [
            "| relay (5,000 committed outbox rows → quorum queue) | msg/s |",
            "|---|---|",
            "| raw aio-pika publisher, 100 confirms in flight (baseline) "
            f"| {_stat(relay['raw'])} |",
            f"| `san-relay` process | {_stat(relay['relay'])} |",
            "",
        ]
    if "similar" in ratios:
        s = ratios["similar"]
        lines += [
            f"| similar cards, {s['cards']:,} clustered cards of one user "
            f"(ef_search {s['ef_search']}) | p50 ms | p99 ms | recall@10 |",
            "|---|---|---|---|",
            f"| exact scan (SQL) | {s['exact_p50_ms']:,.1f} | {s['exact_p99_ms']:,.1f} | 1 |",
            f"| HNSW index forced (SQL, baseline) | {s['forced_sql_p50_ms']:.1f} "
            f"| {s['forced_sql_p99_ms']:.1f} | {s['sql_recall_at_10']:.3f} |",
            f"| `GET /cards/{{id}}/similar-cards` (API, c=1) | {s['api']['p50_ms']:.1f} "
            f"| {s['api']['p99_ms']:.1f} | {s['api_recall_at_10']:.3f} |",
            "",
            f"Index scans of the HNSW index during the API run: {s['api_index_scans']:,} for "
            f"{s['api']['requests']:,} requests; data generated in {s['fill_seconds']:.0f} s "
            f"(index build {s['index_build_seconds']:.0f} s).",
            "",
        ]
    return "\n".join(lines)
