"""End to end: a worker is SIGKILLed while its jobs are PROCESSING; after the ghost sweep
(the `san-recovery run ghost` CLI) a fresh worker completes the same jobs (same ids).
API, relay, ai-worker and recovery run as OS processes over real PostgreSQL and RabbitMQ;
the AI server is the fake one, first hanging, then healthy."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.models import AsyncJob
from tests.e2e.conftest import Stack
from tests.fakes.fake_ai import FakeAiServer
from tests.procs import start
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]


async def test_jobs_of_a_sigkilled_worker_complete_after_the_ghost_sweep(
    stack: Stack,
    db: async_sessionmaker[AsyncSession],
    fake_ai: FakeAiServer,
) -> None:
    ai_env = {
        **stack.env,
        "AI_PROVIDER": "openai",
        "AI_BASE_URL": fake_ai.base_url,
        "AI_API_KEY": "k",
        "AI_TIMEOUT_SECONDS": "120",
    }
    # The maintenance service's lease rescuer heals a SIGKILLed worker's jobs within
    # seconds, under their own ids; it does not run here (no `san-recovery serve`), so the
    # last resort — the ghost sweep, run once by hand — is what is exercised.
    stack.start("relay")
    usual_delay = fake_ai.delay_seconds
    fake_ai.delay_seconds = 120.0
    fake_ai.set_fault("timeout")  # every AI call hangs: the worker sits inside its jobs
    try:
        doomed = start("ai-worker", ai_env, stack.log_dir)
        stack.processes.append(doomed)
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as client:
            headers = stack.headers(f"ghost-{uuid.uuid4().hex}")
            response = await client.post(
                "/scraps", json={"content": "Leases make dead workers visible."}, headers=headers
            )
            assert response.status_code == 202, response.text
            accepted = response.json()
            scrap_id = uuid.UUID(accepted["scrapId"])
            first = {uuid.UUID(accepted["analysisJobId"]), uuid.UUID(accepted["refineJobId"])}

            async def jobs() -> list[AsyncJob]:
                async with db() as session:
                    return list(
                        await session.scalars(
                            select(AsyncJob).where(AsyncJob.target_id == scrap_id)
                        )
                    )

            async def both_processing() -> bool:
                return {j.job_id for j in await jobs() if j.status == "PROCESSING"} == first

            await eventually(
                both_processing, within=30, what="both jobs PROCESSING", context=stack.logs
            )
            doomed.kill()
            # The dead worker's lease would run on for WORKER_LEASE_SECONDS; write it as over.
            async with db() as session, session.begin():
                await session.execute(
                    update(AsyncJob)
                    .where(AsyncJob.job_id.in_(first))
                    .values(lease_expires_at=func.now() - timedelta(minutes=5))
                )

            sweep = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "san_recovery.main", "run", "ghost", "--json",
                env={**os.environ, **stack.env}, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(sweep.communicate(), 60)
            assert sweep.returncode == 0, err.decode()
            by_type = json.loads(out)["sweeps"][0]["by_job_type"]
            assert {t: c["registered"] for t, c in by_type.items()} == {
                "CARD_ANALYSIS": 1,
                "SCRAP_REFINE": 1,
            }

            fake_ai.set_fault(None)
            stack.processes.append(start("ai-worker", ai_env, stack.log_dir))

            async def revived_and_completed() -> bool:
                mine = await jobs()
                return {j.job_id for j in mine} == first and all(
                    j.status == "COMPLETED" for j in mine
                )

            await eventually(
                revived_and_completed,
                within=60,
                what="the revived jobs, under their own ids",
                context=stack.logs,
            )
            for job in await jobs():
                assert job.attempt == 2  # the ghost sweep's revival counts as a re-run
                message = job.last_error or ""
                assert message.startswith("ghost job: worker "), message
                assert "died (lease expired 5 min ago" in message, message
            card = await client.get(f"/cards/{scrap_id}", headers=headers)
            assert card.status_code == 200, card.text
    finally:
        fake_ai.set_fault(None)
        fake_ai.delay_seconds = usual_delay
