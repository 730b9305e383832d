"""worker presence: each worker process's last beat, for the operator console

Revision ID: 0012_worker_presence
Revises: 0011_deployment_identity

One row per worker process, upserted by its presence beat and removed when it stops
cleanly (docs/operations.md, "Console").
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012_worker_presence"
down_revision = "0011_deployment_identity"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_presence",
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("job_types", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("beat_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_worker_presence")),
    )


def downgrade() -> None:
    op.drop_table("worker_presence")
