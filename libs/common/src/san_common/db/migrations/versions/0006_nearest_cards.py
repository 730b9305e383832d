"""nearest cards as SQL functions: the HNSW search with its planner settings in one call

Revision ID: 0006_nearest_cards
Revises: 0005_runtime_v2

The similar-cards query only walks the HNSW index when sorts are off (the planner prices
the index above a parallel sequential scan: it counts the table's pages, not the ~400k
TOASTed embeddings that scan really reads), and it needs `hnsw.ef_search` and
`hnsw.iterative_scan` for its recall under a per-user filter. A function's own `SET`
clauses apply while its body is planned and run, and are undone when it returns: the
settings cannot leak into the rest of the transaction, and a request sends one statement
instead of SET LOCAL, query, reset (three round trips).

ef_search 200 with iterative scan: recall@10 ≥ 0.95 on clustered embeddings at 100k cards
(benchmarks/san_ratios.py measures it against the exact scan on every `make bench`);
tuning it is `ALTER FUNCTION nearest_cards(…) SET hnsw.ef_search = …`, in a migration.
"""

from alembic import op

revision = "0006_nearest_cards"
down_revision = "0005_runtime_v2"
branch_labels = None
depends_on = None

_COLUMNS = """
RETURNS TABLE (id uuid, scrap_id uuid, title text, summary text, distance double precision)
"""
# A missing query vector (no such card) gives NULL distances: no neighbours, not K
# arbitrary cards.
_BODY = """
    SELECT c.id, c.scrap_id, c.title, c.summary, c.embedding <=> query
    FROM knowledge_cards c
    WHERE c.user_id = owner AND c.id <> ALL (excluded) AND (c.embedding <=> query) IS NOT NULL
"""


def upgrade() -> None:
    op.execute(
        f"""
        CREATE FUNCTION nearest_cards(owner uuid, query vector, k integer, excluded uuid[])
        {_COLUMNS}
        LANGUAGE sql STABLE
        SET enable_sort = off
        SET hnsw.ef_search = 200
        SET hnsw.iterative_scan = relaxed_order
        AS $$ {_BODY} ORDER BY c.embedding <=> query LIMIT k $$
        """
    )
    # `+ 0` is not the indexed operator, so no index can order by it: the exact scan over
    # the user's own cards, for when the approximate one finds fewer than K.
    op.execute(
        f"""
        CREATE FUNCTION nearest_cards_exact(owner uuid, query vector, k integer, excluded uuid[])
        {_COLUMNS}
        LANGUAGE sql STABLE
        AS $$ {_BODY} ORDER BY (c.embedding <=> query) + 0 LIMIT k $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION nearest_cards_exact(uuid, vector, integer, uuid[])")
    op.execute("DROP FUNCTION nearest_cards(uuid, vector, integer, uuid[])")
