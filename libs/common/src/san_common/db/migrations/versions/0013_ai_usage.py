"""the AI usage ledger and per-user budget overrides

Revision ID: 0013_ai_usage
Revises: 0012_worker_presence

`ai_usage` has one row per AI call that answered (job, try, model, tokens, latency, cost);
`user_budgets` an operator's override of a user's budget (docs/operations.md, "Budgets").
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_ai_usage"
down_revision = "0012_worker_presence"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ai_usage",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("try_no", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("call", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("embedding_tokens", sa.Integer(), nullable=False),
        sa.Column("estimated", sa.Boolean(), nullable=False),
        sa.Column("latency_ms", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Numeric(18, 9), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ai_usage")),
    )
    op.create_index("ix_ai_usage_user_id_at", "ai_usage", ["user_id", "at"])
    op.create_index("ix_ai_usage_job_id", "ai_usage", ["job_id"])
    op.create_table(
        "user_budgets",
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("tokens_per_day", sa.BigInteger(), nullable=True),
        sa.Column("usd_per_month", sa.Numeric(14, 4), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_user_budgets")),
    )


def downgrade() -> None:
    op.drop_table("user_budgets")
    op.drop_index("ix_ai_usage_job_id", table_name="ai_usage")
    op.drop_index("ix_ai_usage_user_id_at", table_name="ai_usage")
    op.drop_table("ai_usage")
