"""Fixtures over real PostgreSQL (pgvector) and RabbitMQ; see tests/infra.py for where
they come from. The schema is migrated once per run into a template database; tests that
count rows globally take a fresh clone of it (`fresh_db_url`), the rest share one clone
and isolate themselves by creating their own users."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import aio_pika
import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from san_api.app import create_app
from san_api.auth.tokens import mint
from san_api.settings import ApiSettings
from san_common.broker.topology import Topology, declare_topology
from san_common.db.engine import create_engine, create_session_factory, plain_url
from san_common.db.migrate import upgrade
from tests import infra

JWT_SECRET = "test-secret-" + "x" * 40
# base64url of 32 bytes: the test runs' TOKEN_ENCRYPTION_KEYS (san_common.crypto)
TOKEN_KEYS = "JqSQtt2DE8ApEO7q32BRyUIvVvRANJ0fPxXRu7AQrSA"


async def _admin(server_url: str, sql: str) -> None:
    connection = await asyncpg.connect(plain_url(infra.with_database(server_url, "postgres")))
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    with infra.postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
async def template_db(pg_server: str) -> AsyncIterator[str]:
    name = infra.unique_name("san_template")
    await _admin(pg_server, f'CREATE DATABASE "{name}"')
    url = infra.with_database(pg_server, name)
    import asyncio

    await asyncio.to_thread(upgrade, url)
    yield name
    await _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _clone(pg_server: str, template: str) -> str:
    name = infra.unique_name("san_test")
    await _admin(pg_server, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name


@pytest.fixture(scope="session")
async def db_url(pg_server: str, template_db: str) -> AsyncIterator[str]:
    name = await _clone(pg_server, template_db)
    yield infra.with_database(pg_server, name)
    await _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def fresh_db_url(pg_server: str, template_db: str) -> AsyncIterator[str]:
    """A database of its own for a test that counts rows across users."""
    name = await _clone(pg_server, template_db)
    yield infra.with_database(pg_server, name)
    await _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def fresh_sessions(fresh_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on the test's own database (`fresh_db_url`), its engine disposed after."""
    engine = create_engine(fresh_db_url, pool_size=5)
    try:
        yield create_session_factory(engine)
    finally:
        await engine.dispose()


@pytest.fixture(scope="session")
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url, pool_size=20)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
def sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return create_session_factory(engine)


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    with infra.rabbitmq_server() as url:
        yield url


@pytest.fixture
async def topology(amqp_url: str) -> AsyncIterator[Topology]:
    """A prefix of this test's own; its exchanges and queues are deleted afterwards."""
    topology = Topology(prefix=infra.unique_name("santest"))
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    await declare_topology(channel, topology)
    yield topology
    for queue in [*topology.all_queue_names(), topology.owner_queue]:
        await channel.queue_delete(queue)
    for exchange in (topology.jobs_exchange, topology.dead_letter_exchange):
        await channel.exchange_delete(exchange)
    await connection.close()


@pytest.fixture(scope="session")
def fake_ai() -> Iterator[object]:
    from tests.fakes.fake_ai import FakeAiServer

    with FakeAiServer() as server:
        yield server


@pytest.fixture
def token() -> Callable[[str], str]:
    return lambda subject: mint(JWT_SECRET, subject)


@pytest.fixture
def new_user(token: Callable[[str], str]) -> Callable[[], dict[str, str]]:
    """Headers of a brand-new user (isolation by user in the shared database)."""
    return lambda: {"Authorization": f"Bearer {token('user-' + uuid.uuid4().hex)}"}


def api_settings(db_url: str, amqp_url: str, **overrides: object) -> ApiSettings:
    return ApiSettings(
        database_url=db_url,
        amqp_url=amqp_url,
        auth_jwt_secret=JWT_SECRET,
        # the limits have tests of their own (tests/api/test_limits.py); elsewhere they would
        # only make bursts of test requests fail
        **{  # type: ignore[arg-type]
            "token_encryption_keys": TOKEN_KEYS,
            "rate_limit_jobs_burst": 100_000,
            "rate_limit_github_burst": 100_000,
            "active_jobs_max_per_user": 100_000,
            # In-process API tests share the broker and the default prefix, with no relay or
            # worker behind them: published messages would pile up there. The direct
            # publish has tests of its own, on a prefix of their own
            # (tests/faults/test_publish_after_commit.py, tests/observability).
            "api_direct_publish": False,
            **overrides,
        },
    )


ApiFactory = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def api(db_url: str, amqp_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The real API app in-process (ASGI), on the shared test database."""
    app = create_app(api_settings(db_url, amqp_url))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield client
