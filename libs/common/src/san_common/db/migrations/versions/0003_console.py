"""operator console: CANCELLED, audit log, job events (+ trigger), pauses, sweep history

Revision ID: 0003_console
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0003_console"
down_revision = "0002"
branch_labels = None
depends_on = None

OLD_STATUSES = ("PENDING", "PROCESSING", "COMPLETED", "FAILED")
NEW_STATUSES = (*OLD_STATUSES, "CANCELLED")


def _ts(name: str, *, nullable: bool = False) -> sa.Column:  # type: ignore[type-arg]
    default = None if nullable else sa.text("now()")
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, server_default=default)


def _status_check(statuses: tuple[str, ...]) -> None:
    op.drop_constraint("status", "async_jobs", type_="check")
    op.create_check_constraint(
        "status", "async_jobs", "status IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"
    )


def upgrade() -> None:
    _status_check(NEW_STATUSES)
    op.create_index("ix_async_jobs_created_at_job_id", "async_jobs", ["created_at", "job_id"])
    op.create_index("ix_async_jobs_status_finished_at", "async_jobs", ["status", "finished_at"])

    op.create_table(
        "admin_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        _ts("at"),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text()),
        sa.Column("filter", pg.JSONB()),
        sa.Column("count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("detail", pg.JSONB()),
    )
    op.create_index("ix_admin_audit_at", "admin_audit", ["at"])

    op.create_table(
        "async_job_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column(
            "job_id",
            pg.UUID(),
            sa.ForeignKey("async_jobs.job_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("status", sa.Text(), nullable=False),
        _ts("at"),
    )
    op.create_index("ix_async_job_events_job_id_id", "async_job_events", ["job_id", "id"])
    # Every status change (and the insert) is logged and announced; the API's SSE stream
    # LISTENs once per process and reads the log, so no client polls the database.
    op.execute(
        """
        CREATE FUNCTION san_async_job_event() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            event_id bigint;
        BEGIN
            IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status THEN
                INSERT INTO async_job_events (job_id, status)
                VALUES (NEW.job_id, NEW.status) RETURNING id INTO event_id;
                PERFORM pg_notify('san_job_events', NEW.job_id::text || ':' || event_id);
            END IF;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER async_job_events AFTER INSERT OR UPDATE OF status ON async_jobs "
        "FOR EACH ROW EXECUTE FUNCTION san_async_job_event()"
    )

    op.create_table(
        "job_type_pauses",
        sa.Column("job_type", sa.Text(), primary_key=True),
        sa.Column("paused_by", sa.Text(), nullable=False),
        _ts("paused_at"),
    )

    op.create_table(
        "recovery_sweep_runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("sweep", sa.Text(), nullable=False),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.Column("batches", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("totals", pg.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("error", sa.Text()),
        sa.Column("request_id", sa.BigInteger()),
    )
    op.alter_column("recovery_sweep_runs", "started_at", nullable=False, server_default=None)
    op.alter_column("recovery_sweep_runs", "finished_at", nullable=False, server_default=None)
    op.create_index("ix_recovery_sweep_runs_started_at", "recovery_sweep_runs", ["started_at"])

    op.create_table(
        "recovery_sweep_requests",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("sweeps", pg.ARRAY(sa.Text()), nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=False),
        _ts("requested_at"),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.Column("ok", sa.Boolean()),
    )
    op.create_index(
        "ix_recovery_sweep_requests_open",
        "recovery_sweep_requests",
        ["id"],
        postgresql_where=sa.text("started_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("recovery_sweep_requests")
    op.drop_table("recovery_sweep_runs")
    op.drop_table("job_type_pauses")
    op.execute("DROP TRIGGER async_job_events ON async_jobs")
    op.execute("DROP FUNCTION san_async_job_event()")
    op.drop_table("async_job_events")
    op.drop_table("admin_audit")
    op.drop_index("ix_async_jobs_status_finished_at", "async_jobs")
    op.drop_index("ix_async_jobs_created_at_job_id", "async_jobs")
    op.execute("UPDATE async_jobs SET status = 'FAILED' WHERE status = 'CANCELLED'")
    _status_check(OLD_STATUSES)
