"""Log volume of a burst (issue 11): scraps through the real path (API → outbox → relay →
RabbitMQ → worker) leave at most one INFO line per job and exactly one access line per
request — claims are DEBUG, each outcome one INFO line.

The bound is per job, so the suite runs a 200-scrap burst (400 jobs) to stay lean on a
shared 2-core machine; the issue's 2,000-scrap run is the same test with
`SAN_LOG_VOLUME_SCRAPS=2000` (several minutes).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_ai_worker.ai.local import LocalProvider
from san_ai_worker.handlers import build_handlers
from san_api.auth.tokens import mint
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.models import AsyncJob
from san_common.worker import RuntimeConfig
from tests.api.support import api_with
from tests.conftest import JWT_SECRET, api_settings
from tests.running import worker_and_relay
from tests.waiting import eventually

# 4,000 jobs on a shared 2-core machine: minutes, not the suite's default 120 s per test.
pytestmark = [pytest.mark.rabbit, pytest.mark.timeout(900)]

SCRAPS = int(os.environ.get("SAN_LOG_VOLUME_SCRAPS", "200"))
USERS = 20
CONCURRENCY = 16
# Start-up and shutdown lines of the worker and relay, not per job.
FIXED_LINES = 20


class _Counting(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.by_logger: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.by_logger[record.name] += 1


@pytest.fixture
def counted() -> Iterator[_Counting]:
    handler = _Counting()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # the test's own HTTP client; the services quiet it the same way (configure_logging)
    client_logger = logging.getLogger("httpx")
    client_level = client_logger.level
    client_logger.setLevel(logging.WARNING)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)
    client_logger.setLevel(client_level)


async def test_a_burst_logs_one_line_per_job_and_one_per_request(
    fresh_db_url: str, amqp_url: str, topology: Topology, counted: _Counting
) -> None:
    engine = create_engine(fresh_db_url, pool_size=20)
    sessions: async_sessionmaker[AsyncSession] = create_session_factory(engine)
    settings = api_settings(
        fresh_db_url,
        amqp_url,
        amqp_prefix=topology.prefix,
        rate_limit_enabled=False,
        active_jobs_max_per_user=SCRAPS,
    )
    users = [{"Authorization": f"Bearer {mint(JWT_SECRET, f'burst-{i}')}"} for i in range(USERS)]
    config = RuntimeConfig(prefetch=20, lease_seconds=60)
    try:
        async with (
            api_with(settings) as api,
            worker_and_relay(
                sessions, fresh_db_url, amqp_url, topology, build_handlers(LocalProvider()), config
            ),
        ):
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(SCRAPS):
                queue.put_nowait(i)

            async def client() -> None:
                while not queue.empty():
                    i = queue.get_nowait()
                    response = await api.post(
                        "/scraps",
                        json={"content": f"Scrap number {i} of a burst, about logs."},
                        headers=users[i % USERS],
                    )
                    assert response.status_code == 202, response.text

            await asyncio.gather(*(client() for _ in range(CONCURRENCY)))

            async def all_done() -> bool:
                async with sessions() as session:
                    done = await session.scalar(
                        select(func.count())
                        .select_from(AsyncJob)
                        .where(AsyncJob.status.in_(["COMPLETED", "FAILED"]))
                    )
                return done == 2 * SCRAPS

            await eventually(all_done, within=600, what=f"{2 * SCRAPS} jobs settled", interval=1)
    finally:
        await engine.dispose()
    jobs = 2 * SCRAPS  # CARD_ANALYSIS and SCRAP_REFINE per scrap
    access = counted.by_logger.pop("san_api.access", 0)
    assert access == SCRAPS, "one access line per request"
    job_lines = sum(
        n for name, n in counted.by_logger.items() if name.startswith(("san_common", "san_ai"))
    )
    assert job_lines <= jobs + FIXED_LINES, counted.by_logger.most_common(10)
    everything_else = sum(counted.by_logger.values()) - job_lines
    assert everything_else <= FIXED_LINES, counted.by_logger.most_common(10)
