"""worker runtime v2: tries (the fencing token), retry scheduling, try history, delayed outbox

Revision ID: 0005_runtime_v2
Revises: 0004_rate_limits
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0005_runtime_v2"
down_revision = "0004_rate_limits"
branch_labels = None
depends_on = None

_JOB_TYPES = (
    "CARD_ANALYSIS",
    "SCRAP_REFINE",
    "TIL_GENERATION",
    "TIL_GITHUB_COMMIT",
    "RECALL_QUIZ_GENERATION",
    "GITHUB_STAR_RECOMMENDATION",
)


def upgrade() -> None:
    # `tries` counts claims; every write of a try is conditional on it (the fencing token).
    op.add_column(
        "async_jobs", sa.Column("tries", sa.Integer(), nullable=False, server_default="0")
    )
    # Set while a retry waits (status stays PENDING, so the partial unique index holds).
    op.add_column(
        "async_jobs", sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("async_jobs", sa.Column("last_error", sa.Text(), nullable=True))
    op.add_column("async_jobs", sa.Column("error_summary", sa.Text(), nullable=True))
    # A handler's partial result kept across tries (e.g. a successful chat answer).
    op.add_column("async_jobs", sa.Column("checkpoint", pg.JSONB(), nullable=True))
    # Job types are declared by the registry (san_common.jobs.registry), which registration
    # checks; a database list would make adding a job type a migration too.
    op.drop_constraint("job_type", "async_jobs", type_="check")
    op.create_index(
        "ix_async_jobs_lease_expires_at",
        "async_jobs",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'PROCESSING'"),
    )

    op.create_table(
        "async_job_tries",
        sa.Column(
            "job_id",
            pg.UUID(),
            sa.ForeignKey(
                "async_jobs.job_id",
                ondelete="CASCADE",
                name="fk_async_job_tries_job_id_async_jobs",
            ),
            nullable=False,
        ),
        sa.Column("try_no", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        # NULL while the try runs; then completed, failed, retry, rate_limited, lease_lost,
        # released.
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", "try_no", name="pk_async_job_tries"),
    )

    op.add_column(
        "outbox_messages",
        sa.Column(
            "available_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
    )
    op.create_index(
        "ix_outbox_messages_available_at",
        "outbox_messages",
        ["available_at"],
        postgresql_where=sa.text("published_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_messages_available_at", table_name="outbox_messages")
    op.drop_column("outbox_messages", "available_at")
    op.drop_table("async_job_tries")
    op.drop_index("ix_async_jobs_lease_expires_at", table_name="async_jobs")
    known = ", ".join(f"'{t}'" for t in _JOB_TYPES)
    op.execute(f"DELETE FROM async_jobs WHERE job_type NOT IN ({known})")
    op.create_check_constraint("job_type", "async_jobs", f"job_type IN ({known})")
    for column in ("checkpoint", "error_summary", "last_error", "next_attempt_at", "tries"):
        op.drop_column("async_jobs", column)
