"""rate limit buckets (per-user token buckets shared by every API replica)

Revision ID: 0004_rate_limits
Revises: 0003_console
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_rate_limits"
down_revision = "0003_console"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_limit_buckets",
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("bucket", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("subject", "bucket"),
    )


def downgrade() -> None:
    op.drop_table("rate_limit_buckets")
