"""`san-recovery` as an OS process: the one-shot CLI (a Kubernetes CronJob's command), two
overlapping runs, and the long-running scheduler with its probes."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.types import JobType
from san_common.models import AsyncJob, DailySummary, RecallQuizGeneration
from san_recovery.main import main, run_once
from san_recovery.settings import RecoverySettings
from san_recovery.sweeps import Sweep
from tests import infra
from tests.procs import start, wait_healthy, wait_until
from tests.recovery.seed import Seed


async def cli(database_url: str, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "san_recovery.main",
        *args,
        env={**os.environ, "DATABASE_URL": database_url, "SAN_ENV": "test", "LOG_FORMAT": "json"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_run_prints_counts_by_job_type_and_exits_0(seed: Seed, fresh_db_url: str) -> None:
    user = await seed.user()
    await seed.scrap(user)
    code, out, err = await cli(fresh_db_url, "run", "unrefined", "orphans")
    assert code == 0, err
    assert out.splitlines() == [  # in the canonical order, whatever order they were named in
        "orphans: done, found 1, registered 1, given up 0, skipped 0, errors 0 "
        "(CARD_ANALYSIS 1/1/0)",
        "unrefined: done, found 1, registered 1, given up 0, skipped 0, errors 0 "
        "(SCRAP_REFINE 1/1/0)",
    ]
    assert '"sweep": "orphans"' in err and '"registered": 1' in err  # the log line says it too


def test_bad_sweep_name_exits_non_zero_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "everything"])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "usage: san-recovery run" in err and "invalid choice: 'everything'" in err


async def test_unreachable_database_exits_1_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = RecoverySettings(
        database_url=f"postgresql://postgres@127.0.0.1:{infra.free_port()}/x"
    )
    assert await run_once(settings, [Sweep.GHOST], as_json=True) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert report["sweeps"][0]["status"] == "error"
    assert "connect" in report["sweeps"][0]["error"].lower()


def test_bad_cron_expression_is_refused() -> None:
    with pytest.raises(ValidationError, match="not a valid cron expression"):
        RecoverySettings(recovery_schedule="every two hours")


async def test_two_overlapping_runs_register_each_job_once(
    seed: Seed, db: async_sessionmaker[AsyncSession], fresh_db_url: str
) -> None:
    users = [await seed.user() for _ in range(15)]
    for user in users:  # each: a card yesterday (its scrap is unrefined) → TIL, quiz, refine
        await seed.card(user, at=seed.now - timedelta(days=1))
    owner = users[0]
    for _ in range(10):
        ghost_scrap = await seed.scrap(owner, refined=True)
        await seed.job(JobType.CARD_ANALYSIS, ghost_scrap, owner, status="PENDING")
        failed_scrap = await seed.scrap(owner, refined=True)
        await seed.job(JobType.CARD_ANALYSIS, failed_scrap, owner, status="FAILED")
    before = await seed.job_ids()

    results = await asyncio.gather(
        cli(fresh_db_url, "run", "all", "--json"), cli(fresh_db_url, "run", "all", "--json")
    )

    registered: dict[str, int] = {}
    for code, out, err in results:
        assert code == 0, err
        report = json.loads(out)
        assert report["ok"] is True
        assert [s["sweep"] for s in report["sweeps"]] == [
            "ghost", "failed", "orphans", "unrefined", "daily-til", "retention",
        ]  # fmt: skip
        for sweep in report["sweeps"]:
            assert sweep["status"] in ("done", "locked")
            assert set(sweep["totals"]) == {
                "found", "registered", "given_up", "skipped", "errors", "pruned",
            }  # fmt: skip
            registered[sweep["sweep"]] = (
                registered.get(sweep["sweep"], 0) + sweep["totals"]["registered"]
            )
    assert registered == {
        "ghost": 10, "failed": 10, "orphans": 0, "unrefined": 15, "daily-til": 30, "retention": 0,
    }  # fmt: skip
    new = await seed.registered_since(before)
    assert len(new) == 55  # the 10 ghosts are revived under their own ids, not re-created
    assert sum(1 for t, _, a in new if t == "CARD_ANALYSIS" and a == 2) == 10
    revived = await seed.revived(before)
    assert len(revived) == 10 and all(a == 2 for _, _, a in revived)
    async with db() as session:
        tils = await session.scalar(select(func.count()).select_from(DailySummary))
        quizzes = await session.scalar(select(func.count()).select_from(RecallQuizGeneration))
        active = await session.scalar(
            select(func.count()).select_from(AsyncJob).where(AsyncJob.status == "PENDING")
        )
    assert (tils, quizzes, active) == (15, 15, 65)


async def test_serve_runs_the_scheduler_with_probes_until_sigterm(
    fresh_db_url: str, tmp_path: Path
) -> None:
    port = infra.free_port()
    env = {
        "DATABASE_URL": fresh_db_url,
        "SAN_ENV": "test",
        "LOG_FORMAT": "json",
        "PROBE_PORT": str(port),
    }
    process = start("recovery", env, tmp_path)  # no arguments: the scheduler
    try:
        base = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(wait_healthy, base, process)
        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            assert (await client.get("/readyz")).status_code == 200
            assert "san_recovery_sweep_runs_total" in (await client.get("/metrics")).text
        await asyncio.to_thread(
            wait_until, lambda: "sweeps scheduled" in process.log(), 10, "plans"
        )
        scheduled: list[dict[str, Any]] = [
            json.loads(line) for line in process.log().splitlines() if "sweeps scheduled" in line
        ]
        assert {s["cron"] for s in scheduled} == {"0 */2 * * *", "10 0 * * *"}
        # each line names its sweeps, so the two are told apart
        assert {s["cron"]: tuple(s["sweeps"]) for s in scheduled}["10 0 * * *"] == ("daily-til",)
        assert all(", ".join(s["sweeps"]) in s["msg"] for s in scheduled)
    finally:
        code = await asyncio.to_thread(process.terminate)
    assert code == 0, process.log()
    assert "scheduler stopped" in process.log()
