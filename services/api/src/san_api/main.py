"""`san-api`: serve the HTTP API with uvicorn.

Configured by the environment (DATABASE_URL, API_HOST, API_PORT, AUTH_JWT_SECRET, …; see
docs/operations.md). Needs PostgreSQL only: exits 1 with one line when it cannot be reached
at start-up, or when API_PORT is taken. A broker outage is absorbed by the outbox; `/readyz`
shows the broker's state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import uvicorn

from san_api import edge
from san_api.app import create_app
from san_api.settings import ApiSettings
from san_common import cli
from san_common.db.engine import create_engine
from san_common.dependencies import require_database
from san_common.logs import configure_service_logging
from san_common.process import tune_garbage_collector
from san_common.settings import load_settings
from san_common.tracing import configure_tracing, shutdown_tracing

PROG = "san-api"


async def _check_database(settings: ApiSettings) -> None:
    engine = create_engine(settings.database_url, pool_size=1)
    try:
        await require_database(PROG, engine, settings.database_url)
    finally:
        await engine.dispose()


def main(argv: Sequence[str] | None = None) -> None:
    cli.parse(PROG, __doc__ or "", distribution="san-api", argv=argv)
    settings = load_settings(ApiSettings)
    cli.require_free_port(PROG, "API_PORT", settings.api_host, settings.api_port)
    asyncio.run(_check_database(settings))
    configure_service_logging(settings)
    configure_tracing(settings)
    app = create_app(settings)
    tune_garbage_collector()
    try:
        uvicorn.run(
            app,
            host=settings.api_host,
            port=settings.api_port,
            log_config=None,
            timeout_graceful_shutdown=20,
            **edge.server_options(settings),
        )
    finally:
        shutdown_tracing()


if __name__ == "__main__":
    main()
