"""The relay's claim reads its batch from the due index in order, whatever the table's
statistics say (migration 0008's `claim_outbox`). With the statistics of an empty outbox —
a fresh table, or a quiet outbox before an outage piles up a backlog — the planner expected
a handful of due rows: it read every one of them through a bitmap and sorted them all to
lock one batch, each round, until autovacuum's next ANALYZE. The index entries the claim
read in its transaction (`pg_stat_get_xact_tuples_returned`) tell the two plans apart."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from san_common.db.engine import bound_engine
from san_relay import repository

BACKLOG, BATCH = 3000, 100

_ROWS = """
    INSERT INTO outbox_messages (message_id, exchange, routing_key, body)
    SELECT m, 'jobs', 'CARD_ANALYSIS', jsonb_build_object('message_id', m)
    FROM (SELECT gen_random_uuid() AS m FROM generate_series(1, $1)) AS g
"""
_READ = "SELECT pg_stat_get_xact_tuples_returned(to_regclass('ix_outbox_messages_due'))"


async def _entries_read(connection: AsyncConnection) -> int:
    return int((await connection.exec_driver_sql(_READ)).scalar_one())


async def test_a_claim_reads_its_batch_not_the_backlog_under_the_statistics_of_an_empty_outbox(
    fresh_sessions: async_sessionmaker[AsyncSession],
) -> None:
    engine = bound_engine(fresh_sessions)
    async with engine.connect() as connection:
        connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
        # statistics of the empty table, kept while the backlog arrives
        await connection.exec_driver_sql(
            "ALTER TABLE outbox_messages SET (autovacuum_enabled = off)"
        )
        await connection.exec_driver_sql("ANALYZE outbox_messages")
        await connection.exec_driver_sql(_ROWS, (BACKLOG,))

    async with engine.connect() as connection, connection.begin():
        before = await _entries_read(connection)
        batch = await repository.claim_unpublished(connection, BATCH)
        read = await _entries_read(connection) - before

    assert len(batch.rows) == BATCH
    # one transaction's rows are due at once: earliest id first
    ids = [row.id for row in batch.rows]
    assert ids == sorted(ids)
    async with engine.connect() as connection:
        first = (await connection.exec_driver_sql("SELECT min(id) FROM outbox_messages")).scalar()
    assert ids[0] == first
    assert read <= 2 * BATCH, f"the claim read {read} index entries for a batch of {BATCH}"
