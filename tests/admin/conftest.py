"""Fixtures of the admin suite. Its tests retry jobs, which adds outbox messages: on the
shared database a later test's relay would publish them, so every admin test gets a
database of its own (a clone of the migrated template)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.settings import ApiSettings
from san_common.db.engine import create_engine, create_session_factory
from tests.api.support import api_with
from tests.conftest import api_settings


@pytest.fixture
def db_url(fresh_db_url: str) -> str:
    return fresh_db_url


@pytest.fixture
async def sessions(fresh_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(fresh_db_url, pool_size=5)
    yield create_session_factory(engine)
    await engine.dispose()


@pytest.fixture
async def api(fresh_db_url: str, amqp_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_with(api_settings(fresh_db_url, amqp_url)) as client:
        yield client


@pytest.fixture
def settings_for(fresh_db_url: str, amqp_url: str) -> Callable[..., ApiSettings]:
    def build(**overrides: object) -> ApiSettings:
        return api_settings(fresh_db_url, str(overrides.pop("amqp_url", amqp_url)), **overrides)

    return build
