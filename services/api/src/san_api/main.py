"""`san-api`: serve the HTTP API with uvicorn."""

from __future__ import annotations

import uvicorn

from san_api.app import create_app
from san_api.settings import ApiSettings
from san_common.logs import configure_service_logging
from san_common.settings import load_settings
from san_common.tracing import configure_tracing, shutdown_tracing


def main() -> None:
    settings = load_settings(ApiSettings)
    configure_service_logging(settings)
    configure_tracing(settings)
    try:
        uvicorn.run(
            create_app(settings),
            host=settings.api_host,
            port=settings.api_port,
            log_config=None,
            timeout_graceful_shutdown=20,
        )
    finally:
        shutdown_tracing()


if __name__ == "__main__":
    main()
