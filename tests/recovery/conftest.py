from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.db.engine import create_engine, create_session_factory
from tests.e2e.conftest import stack, stack_env  # noqa: F401  (the e2e test's fixtures)
from tests.recovery.seed import Seed, utcnow


@pytest.fixture
async def db(fresh_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on a database of the test's own: sweeps look at every row."""
    engine = create_engine(fresh_db_url, pool_size=5)
    try:
        yield create_session_factory(engine)
    finally:
        await engine.dispose()


@pytest.fixture
def seed(db: async_sessionmaker[AsyncSession]) -> Seed:
    return Seed(db, utcnow())
