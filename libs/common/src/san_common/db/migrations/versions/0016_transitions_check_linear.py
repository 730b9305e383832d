"""the lifecycle's status check stays linear in a statement's rows

Revision ID: 0016_transitions_check_linear
Revises: 0015_cancel_running

0010's statement trigger joins the statement's OLD and NEW transition tables and stops at
the first undeclared change (`LIMIT 1`). Planned for that early stop, the join is a nested
loop, which grows with the square of the rows: a few milliseconds at the workers' batches,
but a tenth of a second at a thousand rows and most of a second at three thousand (a
recovery sweep, an operator's bulk retry). Here the join sits under `OFFSET 0`, planned on
its own as a hash join, and only the lookup of undeclared changes stops at the first.
What is refused is unchanged, and the trigger itself is 0010's: one call per statement,
which at the workers' batch sizes costs less than a row trigger's call per row
(docs/hot-paths.md, "PostgreSQL").
"""

from alembic import op

revision = "0016_transitions_check_linear"
down_revision = "0015_cancel_running"
branch_labels = None
depends_on = None

_CHECK = """
CREATE OR REPLACE FUNCTION san_async_job_transitions_checked() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT c.job_id, c.from_status, c.to_status INTO bad
    FROM (
        SELECT o.job_id, o.status AS from_status, n.status AS to_status
        FROM new_rows n JOIN old_rows o USING (job_id)
        WHERE n.status IS DISTINCT FROM o.status
        OFFSET 0  -- planned without the LIMIT below: a hash join, not a nested loop
    ) c
    WHERE NOT EXISTS (
        SELECT 1 FROM async_job_transitions t
        WHERE t.from_status = c.from_status AND t.to_status = c.to_status
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

# 0010's body, as it was.
_NESTED = """
CREATE OR REPLACE FUNCTION san_async_job_transitions_checked() RETURNS trigger
LANGUAGE plpgsql AS $$
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
    op.execute(_CHECK)


def downgrade() -> None:
    op.execute(_NESTED)
