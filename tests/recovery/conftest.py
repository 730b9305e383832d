from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.depths import QueueDepths
from tests.e2e.conftest import stack, stack_env  # noqa: F401  (the e2e test's fixtures)
from tests.recovery.seed import Seed, utcnow


@pytest.fixture
def db(fresh_sessions: async_sessionmaker[AsyncSession]) -> async_sessionmaker[AsyncSession]:
    """Sessions on a database of the test's own: sweeps look at every row."""
    return fresh_sessions


@pytest.fixture
def seed(db: async_sessionmaker[AsyncSession]) -> Seed:
    return Seed(db, utcnow())


@pytest.fixture
async def depths(amqp_url: str) -> AsyncIterator[QueueDepths]:
    reader = QueueDepths(amqp_url)
    yield reader
    await reader.close()
