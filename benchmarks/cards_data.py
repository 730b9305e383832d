"""Clustered card embeddings for the similar-cards benchmark, generated inside PostgreSQL
(100k × 1536 floats never cross the wire).

Real embeddings of one user's cards are not uniform on the sphere: they bunch by topic.
So each card is a topic centre plus noise, normalised: `CENTRES` topics, the noise's
spread (`SPREAD`) chosen so that a card's ten nearest neighbours are mostly, not only,
of its own topic. Uniform random vectors would be the easy case for recall (every
neighbour almost equally far) and the wrong one for the planner's and the index's work.
"""

from __future__ import annotations

import time

import asyncpg

DIMENSIONS = 1536
CENTRES = 256
NOISE_POOL = 1024
SPREAD = 0.6  # noise per coordinate relative to a centre's (both ~N(0,1) before normalising)


async def fill(
    connection: asyncpg.Connection,
    user_external_id: str,
    cards: int,
    *,
    maintenance_work_mem: str = "2GB",
) -> float:
    """Insert `cards` scraps + cards for one new user, HNSW index built after the rows (as a
    bulk load is done); returns the seconds the index build took."""
    await connection.execute(f"SET maintenance_work_mem = '{maintenance_work_mem}'")
    await connection.execute("SET max_parallel_maintenance_workers = 2")
    await connection.execute("ALTER TABLE knowledge_cards SET (parallel_workers = 2)")
    await connection.execute("DROP INDEX IF EXISTS ix_knowledge_cards_embedding_hnsw")
    user_id = await connection.fetchval(
        "INSERT INTO users (external_id) VALUES ($1) RETURNING id", user_external_id
    )
    # Centres and a pool of noise vectors, each coordinate roughly N(0, 1) (sum of three
    # uniforms); generating 1536 random numbers per card in SQL would take minutes, so a
    # card is a centre plus two pooled noise vectors (a million combinations).
    for table, rows, scale in (("centres", CENTRES, 1.0), ("noise", NOISE_POOL, SPREAD / 2**0.5)):
        await connection.execute(
            f"""
            CREATE TEMP TABLE {table} AS
            SELECT c AS id,
                   array_agg($3 * (random() + random() + random() - 1.5) ORDER BY d)::vector AS v
            FROM generate_series(0, $1 - 1) AS c, generate_series(1, $2) AS d
            GROUP BY c
            """,
            rows,
            DIMENSIONS,
            scale,
        )
    await connection.execute(
        """
        INSERT INTO scraps (id, user_id, content, content_hash)
        SELECT gen_random_uuid(), $1, 'bench card ' || i, md5('bench card ' || i)
        FROM generate_series(1, $2) AS i
        """,
        user_id,
        cards,
    )
    await connection.execute(
        """
        INSERT INTO knowledge_cards (id, user_id, scrap_id, title, summary, embedding)
        SELECT gen_random_uuid(), s.user_id, s.id, 'card', 'summary',
               l2_normalize(c.v + a.v + b.v)
        FROM (
            SELECT id, user_id, floor(random() * $2)::int AS centre,
                   floor(random() * $3)::int AS first, floor(random() * $3)::int AS second
            FROM scraps WHERE user_id = $1
        ) AS s
        JOIN centres AS c ON c.id = s.centre
        JOIN noise AS a ON a.id = s.first
        JOIN noise AS b ON b.id = s.second
        """,
        user_id,
        CENTRES,
        NOISE_POOL,
    )
    await connection.execute("DROP TABLE noise")
    await connection.execute("DROP TABLE centres")
    await connection.execute("ANALYZE knowledge_cards")
    started = time.monotonic()
    await connection.execute(
        "CREATE INDEX ix_knowledge_cards_embedding_hnsw ON knowledge_cards "
        "USING hnsw (embedding vector_cosine_ops)"
    )
    return time.monotonic() - started


async def search_settings(connection: asyncpg.Connection) -> dict[str, str]:
    """The planner settings the API's search runs under (the `SET` clauses of migration
    0006's `nearest_cards`), applied to the open transaction: the index-forced SQL baseline
    is the API's own query plan."""
    config = await connection.fetchval(
        "SELECT proconfig FROM pg_proc WHERE proname = 'nearest_cards'"
    )
    settings = dict(item.split("=", 1) for item in config)
    for name, value in settings.items():
        await connection.execute("SELECT set_config($1, $2, true)", name, value)
    return settings
