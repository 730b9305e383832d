"""the lifecycle's status check fires only on a status change, row by row

Revision ID: 0015_job_transitions_per_row
Revises: 0014_upstream_quotas

0010's check was a statement trigger on every UPDATE of `async_jobs`: each lease extension,
heartbeat and fenced write ran it and joined its transition tables, status moved or not.
Here it is a row trigger on `UPDATE OF status` with `WHEN (OLD.status IS DISTINCT FROM
NEW.status)`, so PostgreSQL skips it without a function call for every other update and
for a status written back unchanged (docs/performance.md, "Drain"). What it refuses is
0010's: a status change that no row of `async_job_transitions` declares, raised inside the
statement, so a batch with one bad row is undone whole.
"""

from alembic import op

revision = "0015_job_transitions_per_row"
down_revision = "0014_upstream_quotas"
branch_labels = None
depends_on = None

_CHECK = """
CREATE FUNCTION san_async_job_transition_checked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM async_job_transitions t
    WHERE t.from_status = OLD.status AND t.to_status = NEW.status;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % cannot go from % to %: not a transition of the job lifecycle',
            NEW.job_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation',
                  HINT = 'change a job''s status through san_common.jobs.lifecycle';
    END IF;
    RETURN NULL;
END $$
"""

_PER_STATEMENT = (
    "CREATE TRIGGER async_job_transitions_checked AFTER UPDATE ON async_jobs "
    "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION san_async_job_transitions_checked()"
)


def upgrade() -> None:
    op.execute("DROP TRIGGER async_job_transitions_checked ON async_jobs")
    op.execute(_CHECK)
    op.execute(
        "CREATE TRIGGER async_job_transition_checked AFTER UPDATE OF status ON async_jobs "
        "FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) "
        "EXECUTE FUNCTION san_async_job_transition_checked()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER async_job_transition_checked ON async_jobs")
    op.execute("DROP FUNCTION san_async_job_transition_checked()")
    op.execute(_PER_STATEMENT)
