"""the job-event log is written once per statement, not once per row

Revision ID: 0009_job_events_per_statement
Revises: 0008_outbox_claim

0003's row trigger logged every status change with an INSERT of its own: for each row, a
PL/pgSQL call and a single-row INSERT run through the executor from start to end, and a
NOTIFY. The workers claim and complete their jobs in batches (one UPDATE for a dozen
jobs, docs/hot-paths.md), so each batch paid that a dozen times over: with the trigger
off, a drain cost PostgreSQL a quarter less CPU a job.

The same log is now written by statement triggers that read the statement's transition
tables: one INSERT … SELECT of every row whose status changed, and the same NOTIFY per
event (`<job_id>:<event id>`, what the API's hub reads). The log's content is unchanged:
one row per insert and per status change, each job's in the order they happened (one
statement changes a job's status once). Transition tables cannot be asked for with a
column list, so the UPDATE trigger fires for every UPDATE of `async_jobs` (a heartbeat
too) and finds no status change there.

A batched status change costs less per row than before, a lone row slightly more (the
transition tables' set-up); the figures are in benchmarks/results/platform.md.
"""

from alembic import op

revision = "0009_job_events_per_statement"
down_revision = "0008_outbox_claim"
branch_labels = None
depends_on = None

_LOG = """
CREATE FUNCTION san_async_job_events_{name}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    announced bigint;
BEGIN
    WITH logged AS (
        INSERT INTO async_job_events (job_id, status)
        SELECT n.job_id, n.status FROM {source}
        RETURNING job_id, id
    )
    SELECT count(pg_notify('san_job_events', job_id::text || ':' || id))
    INTO announced FROM logged;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute("DROP TRIGGER async_job_events ON async_jobs")
    op.execute("DROP FUNCTION san_async_job_event()")
    op.execute(_LOG.format(name="inserted", source="new_rows n"))
    op.execute(
        _LOG.format(
            name="updated",
            source="new_rows n JOIN old_rows o USING (job_id) "
            "WHERE n.status IS DISTINCT FROM o.status",
        )
    )
    op.execute(
        "CREATE TRIGGER async_job_events_inserted AFTER INSERT ON async_jobs "
        "REFERENCING NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION san_async_job_events_inserted()"
    )
    op.execute(
        "CREATE TRIGGER async_job_events_updated AFTER UPDATE ON async_jobs "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION san_async_job_events_updated()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER async_job_events_updated ON async_jobs")
    op.execute("DROP TRIGGER async_job_events_inserted ON async_jobs")
    op.execute("DROP FUNCTION san_async_job_events_updated()")
    op.execute("DROP FUNCTION san_async_job_events_inserted()")
    # 0003's row trigger, as it was
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
