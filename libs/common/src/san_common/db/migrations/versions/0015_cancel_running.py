"""a running job may be cancelled

Revision ID: 0015_cancel_running
Revises: 0014_upstream_quotas

One more declared transition, PROCESSING → CANCELLED (event `cancel_running`), so that the
trigger of migration 0010 lets a cancel end a running job (docs/architecture.md, "Job
lifecycle"). The worker running it is told on the channel `san_job_cancel`.
"""

from alembic import op

revision = "0015_cancel_running"
down_revision = "0014_upstream_quotas"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "INSERT INTO async_job_transitions (from_status, event, to_status) "
        "VALUES ('PROCESSING', 'cancel_running', 'CANCELLED')"
    )


def downgrade() -> None:
    op.execute(
        "DELETE FROM async_job_transitions "
        "WHERE from_status = 'PROCESSING' AND event = 'cancel_running'"
    )
