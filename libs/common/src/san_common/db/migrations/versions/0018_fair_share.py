"""fair share per user and interactive before batch: the outbox rows carry who and how urgent

Revision ID: 0018_fair_share
Revises: 0017_job_waits

Each outbox row now names its user (`user_id`, the nil UUID for a message of no user) and
its priority class (`priority`: 0 interactive, 1 batch), and `users.share_weight` weighs a
user's share of the workers (default 1). The relay admits messages into a queue only up to
an in-flight window; when the window, not the backlog, limits a round, it claims with
`claim_outbox_fair`: the due rows by effective priority (a batch row due for longer than
the aging counts as interactive), then by the user's rank among their own due rows divided
by the user's weight, then by id, at most `rooms[q]` rows for queue `q`; it also answers
the queues it left due rows behind for (`held`) (docs/architecture.md, "Fair share and
priorities").

The index `(user_id, priority, routing_key, id)` over the unpublished rows serves both the
skip scan over the distinct (user, class, job type) groups and, per group, the earliest
rows: a round reads at most `batch` rows per group rather than the whole backlog. The
columns' defaults are constants, so adding them rewrites nothing; the unpublished rows
take their user from their envelope.
"""

import sqlalchemy as sa
from alembic import op

revision = "0018_fair_share"
down_revision = "0017_job_waits"
branch_labels = None
depends_on = None

NIL = "00000000-0000-0000-0000-000000000000"

# `keys[i]` is routed to queue `key_queue[i]`, whose room is `rooms[key_queue[i]]`; a row
# of a routing key not listed is limited by the batch alone.
_CLAIM_FAIR = """
    WITH RECURSIVE grp AS (
        (SELECT o.user_id, o.priority, o.routing_key
         FROM outbox_messages o
         WHERE o.published_at IS NULL
         ORDER BY o.user_id, o.priority, o.routing_key
         LIMIT 1)
        UNION ALL
        SELECT n.user_id, n.priority, n.routing_key
        FROM grp g
        CROSS JOIN LATERAL (
            SELECT o.user_id, o.priority, o.routing_key
            FROM outbox_messages o
            WHERE o.published_at IS NULL
              AND (o.user_id, o.priority, o.routing_key) > (g.user_id, g.priority, g.routing_key)
            ORDER BY o.user_id, o.priority, o.routing_key
            LIMIT 1
        ) n
    ),
    candidate AS (
        SELECT c.id, c.user_id,
               CASE WHEN c.priority > 0
                         AND c.available_at <= now() - make_interval(secs => aging_seconds)
                    THEN 0 ELSE c.priority END AS eff,
               coalesce(q.queue, 0) AS queue
        FROM grp g
        CROSS JOIN LATERAL (
            SELECT o.id, o.user_id, o.priority, o.available_at, o.routing_key
            FROM outbox_messages o
            WHERE o.published_at IS NULL AND o.user_id = g.user_id
              AND o.priority = g.priority AND o.routing_key = g.routing_key
              AND o.available_at <= now()
            ORDER BY o.id
            LIMIT batch
        ) c
        LEFT JOIN unnest(keys, key_queue) AS q(key, queue) ON q.key = c.routing_key
    ),
    ranked AS (
        SELECT c.id, c.eff, c.queue,
               (row_number() OVER (PARTITION BY c.user_id, c.eff, c.queue ORDER BY c.id))::float8
                   / coalesce(u.share_weight, 1) AS share
        FROM candidate c
        LEFT JOIN users u ON u.id = c.user_id
    ),
    placed AS (
        SELECT r.*, row_number() OVER (PARTITION BY r.queue ORDER BY r.eff, r.share, r.id) AS pos
        FROM ranked r
    ),
    chosen AS (
        SELECT p.id, p.eff, p.share
        FROM placed p
        WHERE p.pos <= coalesce(rooms[p.queue], batch)
        ORDER BY p.eff, p.share, p.id
        LIMIT batch
    ),
    due AS (
        SELECT o.id, o.message_id, o.exchange, o.routing_key, o.body::text AS body,
               o.headers::text AS headers, o.created_at,
               o.body->>'traceparent' AS traceparent, o.body->>'tracestate' AS tracestate,
               ch.eff, ch.share
        FROM outbox_messages o
        JOIN chosen ch ON ch.id = o.id
        WHERE o.published_at IS NULL
        FOR UPDATE OF o SKIP LOCKED
    )
    SELECT due.id, due.message_id, due.exchange, due.routing_key, due.body, due.headers,
           due.created_at, due.traceparent, due.tracestate, next.seconds, next.held
    FROM (
        SELECT extract(epoch FROM min(l.available_at) - now())::float8 AS seconds,
               (SELECT array_agg(DISTINCT c.queue) FROM candidate c
                WHERE c.id NOT IN (SELECT ch.id FROM chosen ch)) AS held
        FROM outbox_messages l
        WHERE l.published_at IS NULL AND l.available_at > now()
    ) AS next
    LEFT JOIN due ON true
    ORDER BY due.eff, due.share, due.id
"""


def upgrade() -> None:
    op.add_column(
        "outbox_messages",
        sa.Column("user_id", sa.Uuid(), nullable=False, server_default=sa.text(f"'{NIL}'::uuid")),
    )
    op.add_column(
        "outbox_messages",
        sa.Column("priority", sa.SmallInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.add_column(
        "users",
        sa.Column("share_weight", sa.Float(), nullable=False, server_default=sa.text("1")),
    )
    op.create_check_constraint("share_weight_positive", "users", "share_weight > 0")
    op.execute(
        "UPDATE outbox_messages SET user_id = (body->>'user_id')::uuid "
        "WHERE published_at IS NULL AND body ? 'user_id'"
    )
    op.create_index(
        "ix_outbox_messages_fair",
        "outbox_messages",
        ["user_id", "priority", "routing_key", "id"],
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.execute(
        f"""
        CREATE FUNCTION claim_outbox_fair(
            batch integer, keys text[], key_queue integer[], rooms integer[],
            aging_seconds double precision
        )
        RETURNS TABLE (
            id bigint, message_id uuid, exchange text, routing_key text, body text,
            headers text, created_at timestamptz, traceparent text, tracestate text,
            next_due_seconds double precision, held integer[]
        )
        LANGUAGE sql VOLATILE
        AS $$ {_CLAIM_FAIR} $$
        """
    )


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION claim_outbox_fair(integer, text[], integer[], integer[], double precision)"
    )
    op.drop_index("ix_outbox_messages_fair", table_name="outbox_messages")
    op.drop_constraint("share_weight_positive", "users", type_="check")
    op.drop_column("users", "share_weight")
    op.drop_column("outbox_messages", "priority")
    op.drop_column("outbox_messages", "user_id")
