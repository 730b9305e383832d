"""upstream quotas shared by every worker of a deployment

Revision ID: 0014_upstream_quotas
Revises: 0013_ai_usage

`upstream_quotas` has one row per upstream key (an AI base URL and model, a GitHub token's
digest): what is left of its requests and tokens until each resets, learned from the
upstream's rate-limit headers or from static settings (docs/architecture.md, "Upstream
quotas").
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_upstream_quotas"
down_revision = "0013_ai_usage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "upstream_quotas",
        sa.Column("key", sa.Text(), primary_key=True),
        sa.Column("requests_limit", sa.Integer(), nullable=True),
        sa.Column("requests_remaining", sa.Integer(), nullable=True),
        sa.Column("requests_reset_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("tokens_limit", sa.BigInteger(), nullable=True),
        sa.Column("tokens_remaining", sa.BigInteger(), nullable=True),
        sa.Column("tokens_reset_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("in_flight", sa.Integer(), server_default="0", nullable=False),
        sa.Column("in_flight_tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("waits", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )


def downgrade() -> None:
    op.drop_table("upstream_quotas")
