"""operators' "run now" requests: a heartbeat, an attempt count (fencing token), an error

Revision ID: 0007_sweep_request_heartbeat
Revises: 0006_nearest_cards

A request was marked started and then finished by the recovery process that took it; one
that died in between (a rollout, an OOM kill) left it started and never finished, and no
replica ran it again. The process now beats `heartbeat_at` while it runs a request; an
unfinished request whose heartbeat stopped is taken again (`attempts` + 1), and every later
write of the earlier taker is fenced out by the count. `error` says why a request ended
without running (taken too often).
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_sweep_request_heartbeat"
down_revision = "0006_nearest_cards"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("recovery_sweep_requests", sa.Column("heartbeat_at", sa.DateTime(timezone=True)))
    op.add_column(
        "recovery_sweep_requests",
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column("recovery_sweep_requests", sa.Column("error", sa.Text()))
    # Requests started before this migration were taken once.
    op.execute("UPDATE recovery_sweep_requests SET attempts = 1 WHERE started_at IS NOT NULL")
    op.drop_index("ix_recovery_sweep_requests_open", "recovery_sweep_requests")
    op.create_index(
        "ix_recovery_sweep_requests_unfinished",
        "recovery_sweep_requests",
        ["id"],
        postgresql_where=sa.text("finished_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_recovery_sweep_requests_unfinished", "recovery_sweep_requests")
    op.create_index(
        "ix_recovery_sweep_requests_open",
        "recovery_sweep_requests",
        ["id"],
        postgresql_where=sa.text("started_at IS NULL"),
    )
    op.drop_column("recovery_sweep_requests", "error")
    op.drop_column("recovery_sweep_requests", "attempts")
    op.drop_column("recovery_sweep_requests", "heartbeat_at")
