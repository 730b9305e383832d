"""direct publish: outbox rows the API publishes itself, with the relay as the fallback

Revision ID: 0019_direct_publish
Revises: 0018_fair_share

A row the API chose to publish itself right after its commit (`direct`) is inserted due
only after a grace (`available_at` later than its creation): the relay publishes it only
if nobody marked it by then (docs/architecture.md, "Direct publish"). `direct` tells the
stranded-message check that the row's job has been waiting for it since its creation, not
since it falls due.

The insert trigger's NOTIFY wakes the relay only when the statement inserted a row that is
due: a direct row is not its business before its grace has passed, and the relay's own
wake-up at the next due time (or its poll) finds it then. Still one notification per
statement, read from the statement's transition table.
"""

import sqlalchemy as sa
from alembic import op

revision = "0019_direct_publish"
down_revision = "0018_fair_share"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "outbox_messages",
        sa.Column("direct", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.execute("DROP TRIGGER outbox_messages_notify ON outbox_messages")
    op.execute(
        """
        CREATE OR REPLACE FUNCTION san_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM inserted WHERE available_at <= now()) THEN
                PERFORM pg_notify('san_outbox', '');
            END IF;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_messages_notify AFTER INSERT ON outbox_messages "
        "REFERENCING NEW TABLE AS inserted "
        "FOR EACH STATEMENT EXECUTE FUNCTION san_outbox_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_messages_notify ON outbox_messages")
    op.execute(
        """
        CREATE OR REPLACE FUNCTION san_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('san_outbox', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_messages_notify AFTER INSERT ON outbox_messages "
        "FOR EACH STATEMENT EXECUTE FUNCTION san_outbox_notify()"
    )
    op.drop_column("outbox_messages", "direct")
