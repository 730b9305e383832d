"""bulk lanes: which user's backlog each job queue's bulk lane holds

Revision ID: 0020_bulk_lanes
Revises: 0019_direct_publish

A job queue's bulk lane takes a user's backlog while that user is the only one with work
due for the queue (docs/architecture.md, "Fair share and priorities"). The lane may hold
one user's messages at a time, so that nobody's work waits behind another's in it: the
relays agree on whose they are through this row, locked by the round that publishes into
the lane. A relay hands the lane to another user only once it has read the lane empty.
"""

import sqlalchemy as sa
from alembic import op

revision = "0020_bulk_lanes"
down_revision = "0019_direct_publish"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "outbox_bulk_lanes",
        sa.Column("queue", sa.Text(), primary_key=True),
        sa.Column("user_id", sa.Uuid(), nullable=True),
        sa.Column(
            "taken_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )


def downgrade() -> None:
    op.drop_table("outbox_bulk_lanes")
