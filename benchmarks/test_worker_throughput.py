"""Worker throughput: SCRAP_REFINE jobs (offline `local` AI, no vector insert) drained from
the queue by one worker process-equivalent, at prefetch 1 (the baseline: one job at a time)
against the default prefetch 10. Reported as a ratio measured in the same run."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.registration import register_job_in_transaction
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, OutboxMessage, Scrap, User
from san_common.worker import RuntimeConfig, WorkerRuntime
from san_relay.relay import Relay
from san_relay.settings import RelaySettings

pytestmark = pytest.mark.benchmark

N = 600


async def _drain(db_url: str, amqp_url: str, topology: Topology, prefetch: int) -> float:
    engine = create_engine(db_url, pool_size=prefetch + 4)
    sessions = create_session_factory(engine)
    async with sessions() as session, session.begin():
        user_id = await session.scalar(
            insert(User).values(external_id=f"bench-{uuid.uuid4().hex}").returning(User.id)
        )
        assert user_id is not None
        job_ids = []
        for i in range(N):
            text = f"benchmark scrap {i} {uuid.uuid4()}"
            scrap_id = await session.scalar(
                insert(Scrap)
                .values(
                    user_id=user_id,
                    content=text,
                    content_hash=hashlib.sha256(text.encode()).hexdigest(),
                )
                .returning(Scrap.id)
            )
            assert scrap_id is not None
            job = await register_job_in_transaction(
                session, job_type=JobType.SCRAP_REFINE, target_id=scrap_id, user_id=user_id
            )
            job_ids.append(job.job_id)
    stop = asyncio.Event()
    relay = Relay(
        RelaySettings(database_url=db_url, amqp_url=amqp_url, amqp_prefix=topology.prefix),
        sessions,
        topology,
    )
    relay_task = asyncio.create_task(relay.run(stop))
    # publish everything first, so the measurement is the consumer's alone
    while True:
        async with sessions() as session:
            unpublished = await session.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(OutboxMessage.published_at.is_(None))
            )
        if unpublished == 0:
            break
        await asyncio.sleep(0.05)
    ai = build_provider("local")
    worker = WorkerRuntime(
        session_factory=sessions,
        amqp_url=amqp_url,
        topology=topology,
        handlers=build_handlers(ai),
        config=RuntimeConfig(prefetch=prefetch),
    )
    started = time.perf_counter()
    worker_task = asyncio.create_task(worker.run(stop))
    while True:
        async with sessions() as session:
            done = await session.scalar(
                select(func.count())
                .select_from(AsyncJob)
                .where(AsyncJob.job_id.in_(job_ids), AsyncJob.status == "COMPLETED")
            )
        if done == N:
            break
        await asyncio.sleep(0.02)
    elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.gather(relay_task, worker_task)
    await ai.aclose()
    await engine.dispose()
    return N / elapsed


async def test_worker_throughput_prefetch_1_vs_10(
    fresh_db_url: str, amqp_url: str, topology: Topology
) -> None:
    baseline = await _drain(fresh_db_url, amqp_url, topology, prefetch=1)
    default = await _drain(fresh_db_url, amqp_url, topology, prefetch=10)
    report = (
        f"\n### worker throughput — {time.strftime('%Y-%m-%d %H:%M')} ({N} SCRAP_REFINE jobs)\n"
        "| worker | rate | vs baseline |\n|---|---|---|\n"
        f"| prefetch 1, one job at a time (baseline) | {baseline:,.0f} jobs/s | ×1.00 |\n"
        f"| prefetch 10 (default) | {default:,.0f} jobs/s | ×{default / baseline:.2f} |\n"
    )
    print(report)
    with (Path(__file__).parent / "results.md").open("a") as handle:
        handle.write(report)
    assert default > baseline, report
