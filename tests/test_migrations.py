"""Migrations are the only source of the schema: they must round-trip and match the models."""

from __future__ import annotations

import asyncio

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from san_common.db.engine import create_engine
from san_common.db.migrate import downgrade, upgrade
from san_common.models import Base

INDEX_QUERY = "SELECT indexdef FROM pg_indexes WHERE indexname = :name"
CHECKS_QUERY = """
SELECT pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = 'async_jobs'::regclass AND contype = 'c'
"""


async def test_upgrade_downgrade_round_trip_and_models_match(fresh_db_url: str) -> None:
    await asyncio.to_thread(downgrade, fresh_db_url, "base")
    await asyncio.to_thread(upgrade, fresh_db_url)
    engine = create_engine(fresh_db_url, pool_size=1)
    try:
        async with engine.connect() as connection:
            diff = await connection.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync), Base.metadata)
            )
            index = await connection.scalar(
                text(INDEX_QUERY), {"name": "uk_async_jobs_active_target_job_type"}
            )
    finally:
        await engine.dispose()
    assert diff == [], f"models and migrations disagree: {diff}"
    assert "UNIQUE" in index and "PENDING" in index and "PROCESSING" in index


async def test_the_job_types_are_listed_by_the_registry_not_the_schema(db_url: str) -> None:
    """Registration refuses a type the registry does not hold (tests/jobtype); a CHECK
    listing the types would make every new type — and each test's own — a migration."""
    engine = create_engine(db_url, pool_size=1)
    try:
        async with engine.connect() as connection:
            checks = list(await connection.scalars(text(CHECKS_QUERY)))
    finally:
        await engine.dispose()
    assert not [c for c in checks if "job_type" in c], checks
