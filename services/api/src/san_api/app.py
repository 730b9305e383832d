"""The API's wiring point: `create_app(settings)` builds everything; nothing at import."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import asyncpg
from fastapi import FastAPI

from san_api import docs, health, openapi
from san_api.admin import console
from san_api.admin.broker import BrokerAdmin
from san_api.admin.budgets import router as admin_budgets_router
from san_api.admin.csrf import ConsoleCsrf
from san_api.admin.endpoints import router as admin_router
from san_api.admin.scheduling import router as admin_scheduling_router
from san_api.auth.tokens import token_verifier
from san_api.cards.endpoints import router as cards_router
from san_api.deps import app_connection
from san_api.edge import EdgeMiddleware
from san_api.errors import install_error_handlers
from san_api.github.clients import GithubServices
from san_api.github.endpoints import router as github_router
from san_api.job_events.endpoints import router as job_events_router
from san_api.job_events.hub import JobEventHub
from san_api.job_events.slots import StreamSlots
from san_api.jobs.endpoints import router as jobs_router
from san_api.recall_quizzes.endpoints import router as recall_quizzes_router
from san_api.scraps.endpoints import router as scraps_router
from san_api.settings import ApiSettings
from san_api.til.endpoints import router as til_router
from san_api.usage.endpoints import router as usage_router
from san_api.users.cache import ProvisionedUsers
from san_api.users.endpoints import router as users_router
from san_common import deployment, probes, tracing
from san_common.broker.direct import DirectPublisher
from san_common.broker.monitor import BrokerMonitor
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory, plain_url
from san_common.jobs import publishing
from san_common.probes import Readiness

# PostgreSQL connections of one API process: SQLAlchemy's pool (10, overflow 10) for every
# endpoint but one, and this many for POST /scraps and the rate limiter's token
# (docs/operations.md counts them).
DRIVER_POOL_SIZE = 10


async def _transaction_state_only(connection: asyncpg.Connection) -> None:
    """The reset of a connection given back to the API's asyncpg pool, beyond the rollback of
    an open transaction that the pool always does. Its users keep no session state (no
    LISTEN, SET, cursor or session advisory lock: the user lock is the transaction's), so
    asyncpg's default reset statement would be a round trip per request for nothing."""


def create_app(settings: ApiSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # no pre-ping: three round trips per request; a dead connection is one 503 (the edge)
        # a bound on every wait for PostgreSQL: a partition costs 503s, not hung requests
        timeout = settings.api_database_timeout_seconds
        engine = create_engine(
            settings.database_url, pool_size=10, pre_ping=False, timeout_seconds=timeout
        )
        app.state.engine = engine
        app.state.sessions = create_session_factory(engine)
        # POST /scraps' transactions (LimitedTransaction) and the rate limiter's token: asyncpg's
        # own pool, lighter than SQLAlchemy's under load (docs/hot-paths.md); it connects
        # on first use
        app.state.connections = await asyncpg.create_pool(
            plain_url(settings.database_url),
            min_size=0,
            max_size=DRIVER_POOL_SIZE,
            timeout=timeout,
            command_timeout=timeout,
            reset=_transaction_state_only,
        )
        app.state.github = GithubServices.from_settings(settings)
        app.state.tokens = token_verifier(settings)
        app.state.provisioned_users = ProvisionedUsers()
        # connects on first use
        # its listener checked as often as an idle stream is kept alive
        app.state.job_events = JobEventHub(
            settings.database_url,
            timeout_seconds=timeout,
            probe_seconds=settings.sse_keepalive_seconds,
        )
        app.state.stream_slots = StreamSlots(
            per_user=settings.sse_streams_per_user,
            total=settings.streams_max,
            retry_after=settings.sse_retry_after_seconds,
        )
        app.state.broker_admin = BrokerAdmin(
            settings.amqp_url, Topology(settings.amqp_prefix), settings.rabbitmq_management_url
        )
        broker = BrokerMonitor(settings.amqp_url)
        await broker.start()
        app.state.publisher = None
        if settings.api_direct_publish:
            app.state.publisher = publisher = DirectPublisher(
                broker,
                Topology(settings.amqp_prefix),
                deployment_id=lambda: _deployment_id(app),
                mark=lambda ids: _mark_published(app, ids),
                grace_seconds=settings.api_direct_grace_seconds,
                confirm_seconds=settings.api_direct_confirm_seconds,
            )
            publisher.start()
        app.state.readiness = Readiness(
            required={"database": probes.database(engine)},
            reported={"broker": probes.flag(broker.is_up, "no open connection")},
        )
        try:
            yield
        finally:
            if app.state.publisher is not None:
                await app.state.publisher.close()
            await broker.close()
            await app.state.job_events.aclose()
            if app.state.tokens.jwks is not None:
                await app.state.tokens.jwks.aclose()
            await app.state.github.aclose()
            await app.state.connections.close()
            await engine.dispose()
            # uvicorn ends the process by re-raising SIGTERM after this: export spans now
            await asyncio.to_thread(tracing.flush)

    app = FastAPI(
        title="SAN API",
        version="0.1.0",
        description="Scraps, knowledge cards, TILs and their asynchronous jobs.",
        lifespan=lifespan,
        # FastAPI's own pages load Swagger UI from a CDN; san_api.docs serves its own copy
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs_enabled else None,
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.add_middleware(
        EdgeMiddleware,
        max_body_bytes=settings.request_max_bytes,
        body_seconds=settings.http_body_timeout_seconds,
        csrf=ConsoleCsrf(proxy_header=settings.admin_proxy_header),
    )
    for router in (
        health.router,
        scraps_router,
        cards_router,
        jobs_router,
        job_events_router,
        til_router,
        recall_quizzes_router,
        github_router,
        users_router,
        usage_router,
        admin_router,
        admin_budgets_router,
        admin_scheduling_router,
    ):
        app.include_router(router)
    console.install(app)
    openapi.install(app)  # last: it describes every route above
    if settings.docs_enabled:
        docs.install(app)
    return app


# On the asyncpg pool, as POST /scraps' own statements: a lost connection is handled as
# theirs is (the pool replaced), and SQLAlchemy's pool keeps no connection for it.
async def _deployment_id(app: FastAPI) -> str:
    async with app_connection(app) as connection:
        return await deployment.identity_on(connection)


async def _mark_published(app: FastAPI, ids: Sequence[int]) -> None:
    async with app_connection(app) as connection:
        await publishing.mark_published(connection, ids)
