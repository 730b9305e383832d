"""Cost curves as the tables grow (docs/scaling.md): `python -m benchmarks.scaling`.

Jobs: with N finished jobs (and their published outbox rows) already in the tables —
N = 10k, 100k, 1M — the latency of registering a job (job + outbox row, one transaction,
SAN's registration path), of claim and of complete (the worker's repository calls), of
the relay's claim of a batch of 200 unpublished rows, and the tables' and indexes' sizes
and dead tuples. Cards: the similar-cards SQL (index forced, as the API runs it) and the
exact scan at 10k and 100k cards of one user. Prints one Markdown table per part and
writes them to benchmarks/results/scaling.md. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

import asyncpg

from benchmarks import cards_data
from benchmarks.peers.common import percentile
from benchmarks.run import RESULTS, create_database, load_note
from san_common.db.engine import create_engine, create_session_factory
from san_common.db.migrate import upgrade
from san_common.jobs import repository as jobs
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_relay import repository as outbox
from tests import infra

_FILL_JOBS = """
    WITH j AS (
        INSERT INTO async_jobs (job_id, job_type, target_id, user_id, status, attempt,
                                created_at, updated_at, started_at, finished_at)
        SELECT gen_random_uuid(), 'SCRAP_REFINE', gen_random_uuid(), $1, 'COMPLETED', 1,
               now() - interval '1 hour', now(), now(), now()
        FROM generate_series(1, $2)
        RETURNING job_id
    )
    INSERT INTO outbox_messages (message_id, exchange, routing_key, body, published_at)
    SELECT gen_random_uuid(), 'jobs', 'SCRAP_REFINE',
           jsonb_build_object('job_id', job_id, 'pad', repeat('x', 250)), now()
    FROM j
"""


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} / {percentile(values, 0.99):.2f}"


async def jobs_curve(server: str, sizes: list[int], samples: int) -> list[dict[str, Any]]:
    url = await create_database(server, "bench_scaling_jobs")
    await asyncio.to_thread(upgrade, url)
    db = await asyncpg.connect(url)
    user_id = await db.fetchval("INSERT INTO users (external_id) VALUES ('scale') RETURNING id")
    engine = create_engine(url, pool_size=2)
    sessions = create_session_factory(engine)
    rows: list[dict[str, Any]] = []
    present = 0
    try:
        for size in sizes:
            await db.execute(_FILL_JOBS, user_id, size - present)
            present = size
            await db.execute("VACUUM ANALYZE async_jobs, outbox_messages")
            register, claim, complete, relay_claim = [], [], [], []
            for _ in range(samples):
                t = time.perf_counter()
                job = await register_job(
                    sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=user_id
                )
                register.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                async with sessions() as session, session.begin():
                    await jobs.claim(session, job.job_id, "scale-worker", timedelta(minutes=5))
                claim.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                async with sessions() as session, session.begin():
                    await jobs.complete(session, job.job_id, "scale-worker")
                complete.append((time.perf_counter() - t) * 1000)
            for _ in range(max(1, samples // 10)):
                t = time.perf_counter()
                async with sessions() as session, session.begin():
                    claimed = await outbox.claim_unpublished(session, 200)
                    await outbox.mark_published(session, [r.id for r in claimed])
                relay_claim.append((time.perf_counter() - t) * 1000)
            sizes_mb = await db.fetchrow(
                "SELECT pg_table_size('async_jobs') / 1e6 AS jobs,"
                " pg_indexes_size('async_jobs') / 1e6 AS jobs_idx,"
                " pg_table_size('outbox_messages') / 1e6 AS outbox,"
                " pg_indexes_size('outbox_messages') / 1e6 AS outbox_idx"
            )
            dead = await db.fetchval(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'async_jobs'"
            )
            row = {
                "jobs": size,
                "register_ms": _ms(register),
                "claim_ms": _ms(claim),
                "complete_ms": _ms(complete),
                "relay_batch_200_ms": _ms(relay_claim),
                "async_jobs_mb": f"{sizes_mb['jobs']:.0f} + {sizes_mb['jobs_idx']:.0f} idx",
                "outbox_mb": f"{sizes_mb['outbox']:.0f} + {sizes_mb['outbox_idx']:.0f} idx",
                "dead_tuples_after": dead,
                "load": load_note(),
            }
            print(row, flush=True)
            rows.append(row)
    finally:
        await engine.dispose()
        await db.close()
    return rows


async def cards_curve(server: str, sizes: list[int], samples: int) -> list[dict[str, Any]]:
    from benchmarks.san_ratios import _EXACT, _FORCED

    rows = []
    for size in sizes:
        url = await create_database(server, "bench_scaling_cards")
        await asyncio.to_thread(upgrade, url)
        db = await asyncpg.connect(url)
        try:
            build = await cards_data.fill(db, "scale-cards", size)
            user_id = await db.fetchval("SELECT id FROM users WHERE external_id = 'scale-cards'")
            ids = [
                r[0]
                for r in await db.fetch(
                    "SELECT id FROM knowledge_cards ORDER BY random() LIMIT $1", samples
                )
            ]
            exact, forced, recall = [], [], []
            truth = {}
            for card in ids[: max(5, samples // 5)]:
                t = time.perf_counter()
                truth[card] = {r[0] for r in await db.fetch(_EXACT, card, user_id)}
                exact.append((time.perf_counter() - t) * 1000)
            async with db.transaction():
                await cards_data.search_settings(db)
                for card in ids:
                    t = time.perf_counter()
                    got = {r[0] for r in await db.fetch(_FORCED, card, user_id)}
                    forced.append((time.perf_counter() - t) * 1000)
                    if card in truth:
                        recall.append(len(got & truth[card]) / 10)
            sizes_mb = await db.fetchrow(
                "SELECT pg_total_relation_size('knowledge_cards') / 1e6 AS table_mb,"
                " pg_relation_size('ix_knowledge_cards_embedding_hnsw') / 1e6 AS hnsw_mb"
            )
            row = {
                "cards": size,
                "similar_sql_ms": _ms(forced),
                "exact_ms": _ms(exact),
                "recall_at_10": f"{statistics.mean(recall):.3f}",
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
            parts += ["", "p50 / p99 in ms", "", _table(await jobs_curve(server, args.jobs, 200))]
        if args.cards:
            parts += ["", _table(await cards_curve(server, args.cards, 100))]
    text = "\n".join(parts) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scaling.md").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--cards", type=int, nargs="*", default=[10_000, 100_000])
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
