"""Fixtures of the GitHub suite: a fake GitHub on loopback per test, the real API in-process
wired to it, and (for worker tests) the github-worker and the star-recommendation handler
in-process, fed by the real relay over real RabbitMQ.

Every test here also proves that no token the fake GitHub issued reached a log record
(`_no_token_in_logs`): the HTTP client libraries log at DEBUG, our code at INFO.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers.star_recommendation import StarRecommendationHandler
from san_api.app import create_app
from san_api.settings import ApiSettings
from san_common.broker.topology import Topology
from san_common.crypto import TokenCipher
from san_common.db.engine import create_engine, create_session_factory
from san_common.github import GithubClient
from san_common.quotas import UpstreamQuotas
from san_common.worker import RuntimeConfig, WorkerRuntime
from san_github_worker.handlers import build_handlers
from san_github_worker.locks import UserLocks
from san_relay.relay import Relay
from san_relay.settings import RelaySettings
from tests.conftest import TOKEN_KEYS, api_settings
from tests.e2e.conftest import stack, stack_env  # noqa: F401  (the e2e suite's fixtures)
from tests.fakes.fake_github import FakeGithub
from tests.github.support import REDIRECT_URI, World


@pytest.fixture
def fake_github() -> Iterator[FakeGithub]:
    with FakeGithub() as github:
        yield github


@pytest.fixture(autouse=True)
def _no_token_in_logs(caplog: pytest.LogCaptureFixture, fake_github: FakeGithub) -> Iterator[None]:
    caplog.set_level(logging.INFO)
    for name in (
        "httpx",
        "httpcore",
        "san_common",
        "san_api",
        "san_github_worker",
        "san_ai_worker",
    ):
        caplog.set_level(logging.DEBUG, logger=name)
    yield
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    records = [*caplog.get_records("setup"), *caplog.get_records("call"), *caplog.records]
    text = "\n".join(formatter.format(record) for record in records)
    if fake_github.requests:
        assert text, "nothing was logged: the check below would prove nothing"
    leaked = [t for t in fake_github.issued_tokens if t in text]
    assert not leaked, "a GitHub token reached the logs"


def github_api_settings(
    db_url: str, amqp_url: str, github: FakeGithub, **overrides: object
) -> ApiSettings:
    wired: dict[str, object] = {
        "github_api_url": github.api_url,
        "github_oauth_url": github.oauth_url,
        "github_client_id": github.client_id,
        "github_client_secret": github.client_secret,
        "github_oauth_redirect_url": REDIRECT_URI,
        "github_timeout_seconds": 2.0,
    }
    return api_settings(db_url, amqp_url, **{**wired, **overrides})


@contextlib.asynccontextmanager
async def api_client(settings: ApiSettings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield client


@pytest.fixture
async def world(
    db_url: str, amqp_url: str, fake_github: FakeGithub, engine: AsyncEngine
) -> AsyncIterator[World]:
    """The API in-process on the shared test database (tests isolate by user)."""
    settings = github_api_settings(db_url, amqp_url, fake_github)
    async with api_client(settings) as client:
        yield World(
            fake_github,
            client,
            create_session_factory(engine),
            TokenCipher.from_setting(TOKEN_KEYS),
        )


@pytest.fixture
async def fresh_world(
    fresh_db_url: str, amqp_url: str, fake_github: FakeGithub
) -> AsyncIterator[World]:
    """The API in-process on a database of the test's own (for tests that look at every row)."""
    engine = create_engine(fresh_db_url, pool_size=5)
    try:
        async with api_client(github_api_settings(fresh_db_url, amqp_url, fake_github)) as client:
            yield World(
                fake_github,
                client,
                create_session_factory(engine),
                TokenCipher.from_setting(TOKEN_KEYS),
                engine=engine,
            )
    finally:
        await engine.dispose()


@pytest.fixture
def upstream_quotas_on() -> bool:
    """Whether the workers' GitHub client spends the shared upstream quotas (a module
    overrides this fixture to turn them on)."""
    return False


@pytest.fixture
async def worker_world(
    fresh_db_url: str,
    amqp_url: str,
    topology: Topology,
    fake_github: FakeGithub,
    upstream_quotas_on: bool,
) -> AsyncIterator[World]:
    """API + relay + github-worker + the star handler, all in-process, on a database of the
    test's own and a topology of its own."""
    engine = create_engine(fresh_db_url, pool_size=20)
    sessions = create_session_factory(engine)
    cipher = TokenCipher.from_setting(TOKEN_KEYS)
    github_client = GithubClient(
        fake_github.api_url,
        timeout_seconds=1.0,
        upstream_quotas=UpstreamQuotas(engine) if upstream_quotas_on else None,
    )
    ai = build_provider("local")
    config = RuntimeConfig(prefetch=8, max_tries=3, backoff_seconds=0.05, lease_seconds=30)
    github_worker = WorkerRuntime(
        session_factory=sessions,
        amqp_url=amqp_url,
        topology=topology,
        handlers=build_handlers(github_client, cipher, UserLocks(engine)),
        config=config,
    )
    star_handler = StarRecommendationHandler(ai, github_client, cipher)
    ai_worker = WorkerRuntime(
        session_factory=sessions,
        amqp_url=amqp_url,
        topology=topology,
        handlers={star_handler.job_type: star_handler},
        config=config,
    )
    relay = Relay(
        RelaySettings(database_url=fresh_db_url, amqp_url=amqp_url, amqp_prefix=topology.prefix),
        sessions,
        topology,
    )
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run(stop)) for r in (github_worker, ai_worker, relay)]
    try:
        await asyncio.wait_for(github_worker.connected.wait(), 20)
        await asyncio.wait_for(ai_worker.connected.wait(), 20)
        settings = github_api_settings(fresh_db_url, amqp_url, fake_github)
        async with api_client(settings) as client:
            yield World(fake_github, client, sessions, cipher, engine=engine)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await github_client.aclose()
        await ai.aclose()
        await engine.dispose()
