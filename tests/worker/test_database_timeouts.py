"""The workers', the relay's and the recovery service's engines, as their settings build
them, against a server that goes silent (a TCP proxy whose open connections stop
forwarding, no reset): each wait is bounded, the silent pool is replaced after the first
timeout rather than one timeout per pooled connection, and a transaction its client
stopped driving is ended by the server, so its locks do not stall whoever took over the
work (tests/faults/test_partitions.py runs the same faults against the services as
processes)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from san_ai_worker.handlers.scrap_refine import ScrapRefineHandler
from san_common.db.engine import create_engine, create_session_factory
from san_common.errors import is_connection_loss
from san_common.jobs.registration import RegisteredJob, register_job
from san_common.jobs.types import JobType
from san_common.worker.settings import WorkerSettings
from san_common.worker.store import Claim, SqlJobStore
from san_recovery.settings import RecoverySettings
from san_relay.settings import RelaySettings
from tests.tcp_proxy import TcpProxy

TIMEOUT = 0.5


def _worker_engine(url: str) -> AsyncEngine:
    settings = WorkerSettings(database_url=url, worker_database_timeout_seconds=TIMEOUT)
    return settings.database_engine(pool_size=3)


def _relay_engine(url: str) -> AsyncEngine:
    settings = RelaySettings(
        database_url=url,
        relay_database_timeout_seconds=TIMEOUT,
        relay_publish_timeout_seconds=TIMEOUT,
        relay_rounds_in_flight=1,
    )
    return settings.database_engine()


def _recovery_engine(url: str) -> AsyncEngine:
    settings = RecoverySettings(database_url=url, recovery_database_timeout_seconds=TIMEOUT)
    return settings.database_engine()


ENGINES = pytest.mark.parametrize("build", [_worker_engine, _relay_engine], ids=["worker", "relay"])
# The recovery service's engine pre-pings (it is no hot path): a silent pooled connection
# costs its checkout one timeout and is replaced there, never failing a sweep by itself
# (tests/faults/test_partitions.py), so only the server's side is checked here.
ALL_ENGINES = pytest.mark.parametrize(
    "build",
    [_worker_engine, _relay_engine, _recovery_engine],
    ids=["worker", "relay", "recovery"],
)


async def _pid(engine: AsyncEngine) -> int:
    async with engine.connect() as connection:
        return int(await connection.scalar(text("SELECT pg_backend_pid()")))


async def _registered(
    sessions: async_sessionmaker[AsyncSession], count: int
) -> list[RegisteredJob]:
    return [
        await register_job(
            sessions, job_type=JobType.SCRAP_REFINE, target_id=uuid.uuid4(), user_id=uuid.uuid4()
        )
        for _ in range(count)
    ]


@ENGINES
async def test_after_one_silent_statement_the_pool_is_replaced_not_timed_out_one_by_one(
    db_url: str, build: Callable[[str], AsyncEngine]
) -> None:
    with TcpProxy(db_url) as proxy:
        engine = build(proxy.url)
        try:
            # three pooled connections, all open at once
            opened = set(await asyncio.gather(*(_pid(engine) for _ in range(3))))
            assert len(opened) == 3
            proxy.strand()
            with pytest.raises(TimeoutError) as silent:
                await asyncio.wait_for(_pid(engine), 10 * TIMEOUT)
            assert is_connection_loss(silent.value)  # the executor's outage path
            # the other two pooled connections went silent too: neither costs a timeout
            after = [await asyncio.wait_for(_pid(engine), 10 * TIMEOUT) for _ in range(3)]
            assert not opened & set(after), (opened, after)
        finally:
            await engine.dispose()


async def test_a_claim_that_meets_a_silent_server_replaces_the_pool_too(
    db_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """The claim runs on the connection's asyncpg driver, where SQLAlchemy never sees its
    timeout (`db.engine.driver_connection` does what SQLAlchemy would)."""
    jobs = await _registered(sessions, 4)
    lease = timedelta(seconds=30)
    with TcpProxy(db_url) as proxy:
        engine = _worker_engine(proxy.url)
        store = SqlJobStore(create_session_factory(engine))
        try:
            opened = set(await asyncio.gather(*(_pid(engine) for _ in range(3))))
            assert len(opened) == 3
            proxy.strand()
            with pytest.raises(TimeoutError) as silent:
                await asyncio.wait_for(
                    store.claim(jobs[0].job_id, "w-silent", lease, reclaim_own=False), 10 * TIMEOUT
                )
            assert is_connection_loss(silent.value)  # the executor's outage path
            # the other two pooled connections went silent too: no claim waits on them
            for job in jobs[1:]:
                claimed = await asyncio.wait_for(
                    store.claim(job.job_id, "w-silent", lease, reclaim_own=False), 10 * TIMEOUT
                )
                assert isinstance(claimed, Claim)
        finally:
            await engine.dispose()


@ALL_ENGINES
async def test_a_transaction_its_client_stopped_driving_is_ended_by_the_server(
    db_url: str, build: Callable[[str], AsyncEngine]
) -> None:
    engine = build(db_url)
    other = create_engine(db_url, pool_size=1)
    try:
        async with engine.connect() as silent:
            await silent.execute(text("SELECT pg_advisory_xact_lock(4242)"))
            # the client goes quiet inside its transaction; another waits for its lock
            async with other.connect() as taker:
                await asyncio.wait_for(
                    taker.execute(text("SELECT pg_advisory_xact_lock(4242)")), 20 * TIMEOUT
                )
                await taker.rollback()
            with pytest.raises(Exception) as ended:
                await silent.execute(text("SELECT 1"))
            assert is_connection_loss(ended.value), ended.value
    finally:
        await engine.dispose()
        await other.dispose()


async def test_a_completion_batch_that_meets_a_silent_server_is_an_outage_and_replaces_the_pool(
    db_url: str, sessions: async_sessionmaker[AsyncSession]
) -> None:
    """A completion batch is one transaction on a session (`SqlJobStore._finish_together`):
    a silent server fails it as an outage (the executor gives its jobs back, it does not
    fail them), and the next batch runs on new connections, not on the silent pool."""
    jobs = await _registered(sessions, 4)
    handler = ScrapRefineHandler(ai=None)  # type: ignore[arg-type]  # its write calls no AI
    with TcpProxy(db_url) as proxy:
        engine = _worker_engine(proxy.url)
        store = SqlJobStore(create_session_factory(engine))
        try:
            claims = [
                await store.claim(job.job_id, "w-silent", timedelta(seconds=30), reclaim_own=False)
                for job in jobs
            ]
            assert all(isinstance(c, Claim) for c in claims)
            opened = set(await asyncio.gather(*(_pid(engine) for _ in range(3))))
            assert len(opened) == 3
            proxy.strand()
            finished = await asyncio.wait_for(
                asyncio.gather(
                    *(store.finish(c, handler, "r") for c in claims[:2]), return_exceptions=True
                ),
                10 * TIMEOUT,
            )
            assert all(isinstance(f, Exception) and is_connection_loss(f) for f in finished)
            done = await asyncio.wait_for(
                asyncio.gather(*(store.finish(c, handler, "r") for c in claims[2:])), 10 * TIMEOUT
            )
            assert done == [True, True]
        finally:
            await engine.dispose()
