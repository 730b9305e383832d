"""Running a worker service: what `san-ai-worker` and `san-github-worker` share once their
handlers are built."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from san_common import probes
from san_common.dependencies import require_broker, require_database
from san_common.probes import Readiness
from san_common.process import serve
from san_common.worker.runtime import WorkerRuntime
from san_common.worker.settings import WorkerSettings


async def serve_worker(
    prog: str, settings: WorkerSettings, engine: AsyncEngine, runtime: WorkerRuntime
) -> None:
    """Exit with one line unless PostgreSQL and RabbitMQ answer, then consume until a signal;
    ready while the database answers and the consumers are on."""
    await require_database(prog, engine, settings.database_url)
    await require_broker(prog, settings.amqp_url)
    ready = Readiness(
        {
            "database": probes.database(engine),
            "consumer": probes.flag(runtime.consuming, "not consuming"),
        }
    )
    await serve(settings, runtime.run, ready)
