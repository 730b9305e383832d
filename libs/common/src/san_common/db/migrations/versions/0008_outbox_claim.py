"""the relay's claim walks one index in order, whatever the table's statistics say

Revision ID: 0008_outbox_claim
Revises: 0007_sweep_request_heartbeat

The claim took the due rows `ORDER BY id LIMIT n` and had two indexes to choose from
(unpublished rows by id, by `available_at`). With statistics that count few unpublished
rows — a fresh table, or the usual state of an outbox before an outage piles up a
backlog — the planner expects a handful of due rows and reads them all through a bitmap
of the `available_at` index, then sorts them: every round read and sorted the whole
backlog to lock a batch of it, until autovacuum's next ANALYZE — which a large outbox
(published rows are kept for a while) reaches only after a tenth of it has changed. A
claim of 200 rows in its transaction took ~20 ms at 100,000 due rows, ~2 ms on the index
in order, whatever the backlog (docs/hot-paths.md, "Relay").

Now one index serves both conditions in the claim's order: `(available_at, id)` over the
unpublished rows, and the batch is the earliest due first (rows of one transaction, due
at its start, in id order). `claim_outbox` is the claim as a function whose own
`enable_sort = off` leaves the planner one way — that index, in order, stopping at the
batch — without a SET LOCAL round trip or a setting leaking into the round's transaction
(a function's SET clauses apply while its body is planned and run, as 0006's do).
The two indexes it replaces cost every registration an index insert each.
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_outbox_claim"
down_revision = "0007_sweep_request_heartbeat"
branch_labels = None
depends_on = None

# The batch due now, and when the next row scheduled for later falls due (the one-row
# `next` joined to the batch comes back when nothing is due too).
_CLAIM = """
    WITH due AS (
        SELECT o.id, o.message_id, o.exchange, o.routing_key, o.body::text AS body,
               o.headers::text AS headers, o.created_at, o.available_at,
               o.body->>'traceparent' AS traceparent, o.body->>'tracestate' AS tracestate
        FROM outbox_messages o
        WHERE o.published_at IS NULL AND o.available_at <= now()
        ORDER BY o.available_at, o.id
        LIMIT batch
        FOR UPDATE SKIP LOCKED
    )
    SELECT due.id, due.message_id, due.exchange, due.routing_key, due.body, due.headers,
           due.created_at, due.traceparent, due.tracestate, next.seconds
    FROM (
        SELECT extract(epoch FROM min(l.available_at) - now())::float8 AS seconds
        FROM outbox_messages l
        WHERE l.published_at IS NULL AND l.available_at > now()
    ) AS next
    LEFT JOIN due ON true
    ORDER BY due.available_at, due.id
"""


def upgrade() -> None:
    op.create_index(
        "ix_outbox_messages_due",
        "outbox_messages",
        ["available_at", "id"],
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_index("ix_outbox_messages_available_at", table_name="outbox_messages")
    op.drop_index("ix_outbox_messages_unpublished", table_name="outbox_messages")
    op.execute(
        f"""
        CREATE FUNCTION claim_outbox(batch integer)
        RETURNS TABLE (
            id bigint, message_id uuid, exchange text, routing_key text, body text,
            headers text, created_at timestamptz, traceparent text, tracestate text,
            next_due_seconds double precision
        )
        LANGUAGE sql VOLATILE
        SET enable_sort = off
        AS $$ {_CLAIM} $$
        """
    )


def downgrade() -> None:
    op.execute("DROP FUNCTION claim_outbox(integer)")
    op.create_index(
        "ix_outbox_messages_unpublished",
        "outbox_messages",
        ["id"],
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_index(
        "ix_outbox_messages_available_at",
        "outbox_messages",
        ["available_at"],
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_index("ix_outbox_messages_due", table_name="outbox_messages")
