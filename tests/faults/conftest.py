"""Fixtures of the fault tests: a gated fake AI per test, a stack of OS processes, and a
dedicated PostgreSQL server for the test that stops and starts it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.db.migrate import upgrade
from tests import infra
from tests.faults.gated_ai import GatedAi
from tests.faults.harness import FaultStack
from tests.faults.postgres import DedicatedPostgres, dedicated_postgres


@pytest.fixture
def gated_ai() -> Iterator[GatedAi]:
    with GatedAi() as ai:
        yield ai


@pytest.fixture
def stack(
    fresh_db_url: str, amqp_url: str, topology: Topology, gated_ai: GatedAi, tmp_path: Path
) -> Iterator[FaultStack]:
    """Processes over a database of this test's own on the shared server."""
    stack = FaultStack(fresh_db_url, amqp_url, topology.prefix, gated_ai, tmp_path)
    try:
        yield stack
    finally:
        gated_ai.open_gate()
        stack.stop_all()


@pytest.fixture
def own_postgres() -> Iterator[DedicatedPostgres]:
    with dedicated_postgres() as server:
        yield server


@pytest.fixture
async def own_db_url(own_postgres: DedicatedPostgres) -> str:
    """A migrated database on the dedicated server (the server goes away with the test)."""
    import asyncpg

    from san_common.db.engine import plain_url

    name = infra.unique_name("san_faults")
    admin = await asyncpg.connect(plain_url(own_postgres.url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = infra.with_database(own_postgres.url, name)
    await asyncio.to_thread(upgrade, url)
    return url


@pytest.fixture
def own_stack(
    own_db_url: str, amqp_url: str, topology: Topology, gated_ai: GatedAi, tmp_path: Path
) -> Iterator[FaultStack]:
    stack = FaultStack(own_db_url, amqp_url, topology.prefix, gated_ai, tmp_path)
    try:
        yield stack
    finally:
        gated_ai.open_gate()
        stack.stop_all()


async def _sessions(url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(url, pool_size=4)
    try:
        yield create_session_factory(engine)
    finally:
        await engine.dispose()


@pytest.fixture
async def db(fresh_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    async for sessions in _sessions(fresh_db_url):
        yield sessions


@pytest.fixture
async def own_db(own_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    async for sessions in _sessions(own_db_url):
        yield sessions
