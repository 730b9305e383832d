"""what a PENDING job waits for

Revision ID: 0017_job_waits
Revises: 0016_transitions_check_linear

`async_jobs.waiting_for` says why a PENDING job's next try waits (an upstream's quota, its
user's budget: `san_common.errors.WAITING_FOR`), and `waiting_key` which upstream quota it
waits for; the wait ends at `next_attempt_at`. The lifecycle sets both when a try ends in
such a wait and clears them at the next claim. The partial index serves the scaling signal
and the console, which count the jobs waiting for each quota (docs/operations.md,
"Waiting jobs").
"""

import sqlalchemy as sa
from alembic import op

revision = "0017_job_waits"
down_revision = "0016_transitions_check_linear"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("async_jobs", sa.Column("waiting_for", sa.Text(), nullable=True))
    op.add_column("async_jobs", sa.Column("waiting_key", sa.Text(), nullable=True))
    op.create_check_constraint(
        "waiting_for",
        "async_jobs",
        "waiting_for IN ('upstream-quota', 'budget', 'fair-share')",
    )
    op.create_index(
        "ix_async_jobs_waiting_for_waiting_key",
        "async_jobs",
        ["waiting_for", "waiting_key"],
        postgresql_where=sa.text("status = 'PENDING' AND waiting_for IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_async_jobs_waiting_for_waiting_key", table_name="async_jobs")
    op.drop_constraint("waiting_for", "async_jobs", type_="check")
    op.drop_column("async_jobs", "waiting_key")
    op.drop_column("async_jobs", "waiting_for")
