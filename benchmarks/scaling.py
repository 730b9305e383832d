"""Cost curves as the tables grow (docs/scaling.md): `python -m benchmarks.scaling`.

Jobs: with N finished jobs (each with its try, its event and its published outbox row)
already in the tables — N = 10k, 100k, 1M — the latency of registering a job (SAN's
registration path), of the worker's claim and completion statements for one job and for a
batch of 25 (as `SqlJobStore` runs them), of the relay's round (claim + mark 200) and of
its claim when nothing is due; the dead tuples the run left and how long VACUUM takes
them; the tables' and indexes' sizes. Cards: the similar-cards SQL (index forced, as the
API runs it) against the exact scan, recall@10, insert and index-build times and sizes,
at 10k and 100k cards of one user (`--cards 1000000` for a million: about an hour). Prints
one Markdown table per part and writes them to benchmarks/results/scaling.md. Reported,
never asserted; tests/benchmarks/test_scaling.py runs it small.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from benchmarks import cards_data
from benchmarks.peers.common import percentile
from benchmarks.run import RESULTS, create_database, load_note
from san_common.db.engine import create_engine, create_session_factory
from san_common.db.migrate import upgrade
from san_common.jobs import lifecycle as jobs
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_relay import repository as outbox
from tests import infra

_LEASE = timedelta(minutes=5)

# N finished jobs as the tables hold them after N jobs ran: the job row (its insert logs one
# event through the trigger), its one try, its published outbox row.
_FILL_JOBS = """
    WITH j AS (
        INSERT INTO async_jobs (job_id, job_type, target_id, user_id, status, attempt, tries,
                                created_at, updated_at, started_at, finished_at)
        SELECT gen_random_uuid(), 'SCRAP_REFINE', gen_random_uuid(), $1, 'COMPLETED', 1, 1,
               now() - interval '1 hour', now(), now(), now()
        FROM generate_series(1, $2)
        RETURNING job_id
    ), t AS (
        INSERT INTO async_job_tries (job_id, try_no, worker_id, outcome, finished_at)
        SELECT job_id, 1, 'scale-worker', 'completed', now() FROM j
    )
    INSERT INTO outbox_messages (message_id, exchange, routing_key, body, published_at)
    SELECT gen_random_uuid(), 'jobs', 'SCRAP_REFINE',
           jsonb_build_object('job_id', job_id, 'pad', repeat('x', 250)), now()
    FROM j
"""
# Unpublished rows for the relay's rounds, as registrations leave them.
_FILL_OUTBOX = """
    INSERT INTO outbox_messages (message_id, exchange, routing_key, body)
    SELECT gen_random_uuid(), 'jobs', 'SCRAP_REFINE',
           jsonb_build_object('job_id', gen_random_uuid(), 'pad', repeat('x', 250))
    FROM generate_series(1, $1)
"""
BATCH = 25  # a claim / completion batch under load (performance.md: 15–25 at prefetch 50)
RELAY_BATCH = 200  # RELAY_BATCH_SIZE's default


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} / {percentile(values, 0.99):.2f}"


def _pair(timer: _Timer, label: str) -> str:
    return f"{_ms(timer.ms[f'claim {label}'])}; {_ms(timer.ms[f'complete {label}'])}"


class _Timer:
    """Milliseconds per named step, appended to lists."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, name: str) -> AsyncIterator[None]:
        started = time.perf_counter()
        yield
        self.ms.setdefault(name, []).append((time.perf_counter() - started) * 1000)


async def _worker_steps(
    engine: AsyncEngine,
    sessions: async_sessionmaker[AsyncSession],
    timer: _Timer,
    user_id: uuid.UUID,
    size: int,
) -> None:
    """Register `size` jobs one by one, then claim and complete them as the worker does
    (`SqlJobStore`): the claim one statement on an autocommit connection, the completion
    one statement in a transaction."""
    registered = []
    for _ in range(size):
        async with timer("register" if size == 1 else "register_batch"):
            job = await register_job(
                sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=user_id
            )
        registered.append(job.job_id)
    label = "1" if size == 1 else str(size)
    async with timer(f"claim {label}"), engine.connect() as connection:
        connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        claimed = await jobs.claim_batch(connection, registered, "scale-worker", _LEASE)
    tries = [(job_id, c.job.tries) for job_id, c in claimed.items() if isinstance(c, jobs.Claimed)]
    assert len(tries) == size, "every registered job is claimable"
    async with timer(f"complete {label}"), sessions() as session, session.begin():
        done = await jobs.complete_batch(session, tries)
    assert len(done) == size, "every claimed try completes"


async def _relay_steps(
    engine: AsyncEngine, db: asyncpg.Connection, timer: _Timer, rounds: int
) -> None:
    """The relay's round without the publish (`Relay.publish_once`): claim a batch and
    mark it, in one transaction; then its claim when nothing is due (every wake-up)."""
    await db.execute(_FILL_OUTBOX, rounds * RELAY_BATCH)
    for _ in range(rounds):
        async with timer("relay round"), engine.begin() as connection:
            batch = await outbox.claim_unpublished(connection, RELAY_BATCH)
            await outbox.mark_published(connection, [row.id for row in batch.rows])
    while True:  # what registrations left unpublished
        async with engine.begin() as connection:
            batch = await outbox.claim_unpublished(connection, 5000)
            await outbox.mark_published(connection, [row.id for row in batch.rows])
        if not batch.rows:
            break
    for _ in range(rounds * 5):
        async with timer("relay empty"), engine.begin() as connection:
            await outbox.claim_unpublished(connection, RELAY_BATCH)


async def jobs_curve(server: str, sizes: list[int], samples: int) -> list[dict[str, Any]]:
    url = await create_database(server, "bench_scaling_jobs")
    await asyncio.to_thread(upgrade, url)
    db = await asyncpg.connect(url)
    user_id = await db.fetchval("INSERT INTO users (external_id) VALUES ('scale') RETURNING id")
    # the workers' engine settings (WorkerSettings.database_engine)
    engine = create_engine(url, pool_size=2, pre_ping=False, generic_plans=True)
    sessions = create_session_factory(engine)
    rows: list[dict[str, Any]] = []
    present = 0
    try:
        for size in sizes:
            started = time.perf_counter()
            await db.execute(_FILL_JOBS, user_id, size - present)
            await db.execute("VACUUM ANALYZE async_jobs, async_job_tries, outbox_messages")
            fill_s = time.perf_counter() - started
            present = size
            timer = _Timer()
            for _ in range(samples):
                await _worker_steps(engine, sessions, timer, user_id, 1)
            for _ in range(max(1, samples // BATCH)):
                await _worker_steps(engine, sessions, timer, user_id, BATCH)
            await _relay_steps(engine, db, timer, max(1, samples // 10))
            # a backend reports its table statistics when idle or closing: close them all
            await engine.dispose()
            dead = await db.fetchval(
                "SELECT sum(n_dead_tup) FROM pg_stat_user_tables"
                " WHERE relname IN ('async_jobs', 'async_job_tries', 'outbox_messages')"
            )
            started = time.perf_counter()
            await db.execute("VACUUM async_jobs, async_job_tries, outbox_messages")
            vacuum_s = time.perf_counter() - started
            mb = await db.fetchrow(
                "SELECT pg_table_size('async_jobs') / 1e6 AS jobs,"
                " pg_indexes_size('async_jobs') / 1e6 AS jobs_idx,"
                " pg_total_relation_size('async_job_tries') / 1e6 AS tries,"
                " pg_total_relation_size('async_job_events') / 1e6 AS events,"
                " pg_table_size('outbox_messages') / 1e6 AS outbox,"
                " pg_indexes_size('outbox_messages') / 1e6 AS outbox_idx"
            )
            row = {
                "jobs": size,
                "register": _ms(timer.ms["register"]),
                "claim 1; complete 1": _pair(timer, "1"),
                f"claim {BATCH}; complete {BATCH}": _pair(timer, str(BATCH)),
                f"relay: claim + mark {RELAY_BATCH}": _ms(timer.ms["relay round"]),
                "relay: claim, nothing due": _ms(timer.ms["relay empty"]),
                "dead tuples; VACUUM (s)": f"{dead:,}; {vacuum_s:.2f}",
                "async_jobs (+ idx); tries; events; outbox (+ idx), MB": (
                    f"{mb['jobs']:.0f} + {mb['jobs_idx']:.0f}; {mb['tries']:.0f}; "
                    f"{mb['events']:.0f}; {mb['outbox']:.0f} + {mb['outbox_idx']:.0f}"
                ),
                "fill + VACUUM ANALYZE (s)": f"{fill_s:.0f}",
                "load": load_note(),
            }
            print(row, flush=True)
            rows.append(row)
    finally:
        await engine.dispose()
        await db.close()
    return rows


async def cards_curve(
    server: str, sizes: list[int], samples: int, ef_searches: Sequence[int | None] = (None,)
) -> list[dict[str, Any]]:
    """One row per size and `hnsw.ef_search` (None: the `nearest_cards` function's own)."""
    from benchmarks.san_ratios import _EXACT

    rows = []
    for size in sizes:
        url = await create_database(server, "bench_scaling_cards")
        await asyncio.to_thread(upgrade, url)
        db = await asyncpg.connect(url)
        try:
            started = time.perf_counter()
            build = await cards_data.fill(
                db, "scale-cards", size, maintenance_work_mem=_graph_memory(size)
            )
            fill_s = time.perf_counter() - started - build
            user_id = await db.fetchval("SELECT id FROM users WHERE external_id = 'scale-cards'")
            ids = [
                r[0]
                for r in await db.fetch(
                    "SELECT id FROM knowledge_cards ORDER BY random() LIMIT $1", samples
                )
            ]
            exact = []
            truth = {}
            # an exact scan reads every embedding of the user: ~5 s each at 1M cards
            for card in ids[: max(5, samples // (5 if size < 500_000 else 10))]:
                t = time.perf_counter()
                truth[card] = {r[0] for r in await db.fetch(_EXACT, card, user_id)}
                exact.append((time.perf_counter() - t) * 1000)
            sizes_mb = await db.fetchrow(
                "SELECT pg_total_relation_size('knowledge_cards') / 1e6 AS table_mb,"
                " pg_relation_size('ix_knowledge_cards_embedding_hnsw') / 1e6 AS hnsw_mb"
            )
            for ef_search in ef_searches:
                searched, recall = await _searches(db, user_id, ids, truth, ef_search)
                row = {
                    "cards": size,
                    "ef_search": "function's" if ef_search is None else ef_search,
                    "similar_sql_ms": _ms(searched),
                    "exact_ms": _ms(exact),
                    "recall_at_10": f"{statistics.mean(recall):.3f}",
                    "rows_insert_s": f"{fill_s:.0f}",
                    "index_build_s": f"{build:.0f}",
                    "table_mb": f"{sizes_mb['table_mb']:.0f}",
                    "hnsw_mb": f"{sizes_mb['hnsw_mb']:.0f}",
                    "load": load_note(),
                }
                print(row, flush=True)
                rows.append(row)
        finally:
            await db.close()
    return rows


async def _searches(
    db: asyncpg.Connection,
    user_id: uuid.UUID,
    cards: list[uuid.UUID],
    truth: dict[uuid.UUID, set[uuid.UUID]],
    ef_search: int | None,
) -> tuple[list[float], list[float]]:
    """The similar-cards SQL for each card under the API's planner settings (`ef_search`
    overriding the function's): milliseconds each, and recall@10 where the truth is known."""
    from benchmarks.san_ratios import _FORCED

    searched, recall = [], []
    async with db.transaction():
        await cards_data.search_settings(db)
        if ef_search is not None:
            await db.execute("SELECT set_config('hnsw.ef_search', $1, true)", str(ef_search))
        for card in cards:
            t = time.perf_counter()
            got = {r[0] for r in await db.fetch(_FORCED, card, user_id)}
            searched.append((time.perf_counter() - t) * 1000)
            if card in truth:
                recall.append(len(got & truth[card]) / 10)
    return searched, recall


def _graph_memory(cards: int) -> str:
    """`maintenance_work_mem` for an HNSW build that keeps the graph in memory (~8 KB a
    card at 1536 dimensions; a graph that does not fit is built on disk, many times slower)."""
    return f"{min(12, max(1, -(-cards * 10 // 1_000_000)))}GB"


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    return "\n".join(
        [
            "| " + " | ".join(keys) + " |",
            "|" + "---|" * len(keys),
            *(
                "| "
                + " | ".join(f"{r[k]:,}" if isinstance(r[k], int) else str(r[k]) for k in keys)
                + " |"
                for r in rows
            ),
        ]
    )


async def main_async(args: argparse.Namespace) -> None:
    with infra.postgres_server() as server:
        parts = [f"### scaling — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"]
        if args.jobs:
            curve = await jobs_curve(server, args.jobs, args.samples)
            parts += ["", "p50 / p99 in ms", "", _table(curve)]
        if args.cards:
            curve = await cards_curve(server, args.cards, args.samples // 2, args.ef_search)
            parts += ["", _table(curve)]
    text = "\n".join(parts) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / args.out).write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--cards", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--samples", type=int, default=200, help="jobs (cards: half) per size")
    parser.add_argument(
        "--ef-search",
        type=int,
        nargs="+",
        default=[None],
        help="cards: hnsw.ef_search values to measure (default: the function's own)",
    )
    parser.add_argument("--out", default="scaling.md", help="results file (benchmarks/results/)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
