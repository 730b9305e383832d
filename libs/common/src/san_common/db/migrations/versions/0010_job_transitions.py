"""the database refuses a job status change the lifecycle does not declare

Revision ID: 0010_job_transitions
Revises: 0009_job_events_per_statement

`async_job_transitions` holds the rows of `san_common.jobs.lifecycle.TRANSITIONS` (from
status, event, to status); `tests/worker/test_lifecycle.py` keeps the two equal, so a
change of the table is a migration too. A statement trigger on `async_jobs` reads the
statement's transition tables, as 0009's event log does (one call per statement, not per
row: the workers claim and complete in batches), and raises on any row whose status moved
from one value to another that no transition declares: a raw UPDATE that would corrupt a
job fails loudly, and its whole statement is undone. Inserts are not checked: a job is
registered PENDING (the column's default).
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_job_transitions"
down_revision = "0009_job_events_per_statement"
branch_labels = None
depends_on = None

# (from status, event, to status): as `lifecycle.TRANSITIONS` had it when this was written.
_TRANSITIONS = (
    ("PENDING", "claim", "PROCESSING"),
    ("PROCESSING", "take_over", "PROCESSING"),
    ("PROCESSING", "complete", "COMPLETED"),
    ("PROCESSING", "fail", "FAILED"),
    ("PROCESSING", "retry_later", "PENDING"),
    ("PROCESSING", "release", "PENDING"),
    ("PROCESSING", "rescue", "PENDING"),
    ("PENDING", "revive", "PENDING"),
    ("PROCESSING", "revive", "PENDING"),
    ("PENDING", "give_up", "FAILED"),
    ("PROCESSING", "give_up", "FAILED"),
    ("FAILED", "give_up", "FAILED"),
    ("FAILED", "retry", "PENDING"),
    ("PENDING", "cancel", "CANCELLED"),
)

_CHECK = """
CREATE FUNCTION san_async_job_transitions_checked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT o.job_id, o.status AS from_status, n.status AS to_status INTO bad
    FROM new_rows n JOIN old_rows o USING (job_id)
    WHERE n.status IS DISTINCT FROM o.status
      AND NOT EXISTS (
        SELECT 1 FROM async_job_transitions t
        WHERE t.from_status = o.status AND t.to_status = n.status
      )
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'job % cannot go from % to %: not a transition of the job lifecycle',
            bad.job_id, bad.from_status, bad.to_status
            USING ERRCODE = 'check_violation',
                  HINT = 'change a job''s status through san_common.jobs.lifecycle';
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    transitions = op.create_table(
        "async_job_transitions",
        sa.Column("from_status", sa.Text(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("to_status", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("from_status", "event", name="pk_async_job_transitions"),
    )
    op.bulk_insert(
        transitions,
        [{"from_status": f, "event": e, "to_status": t} for f, e, t in _TRANSITIONS],
    )
    op.execute(_CHECK)
    op.execute(
        "CREATE TRIGGER async_job_transitions_checked AFTER UPDATE ON async_jobs "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION san_async_job_transitions_checked()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER async_job_transitions_checked ON async_jobs")
    op.execute("DROP FUNCTION san_async_job_transitions_checked()")
    op.drop_table("async_job_transitions")
