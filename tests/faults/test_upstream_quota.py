"""Issue 38, acceptance 1: the fake AI enforces OpenAI-style quotas (120 requests and
40,000 tokens a minute) on two ai-worker OS processes. With upstream quotas shared through
PostgreSQL every job completes, at most 2 % of the calls meet a 429, no try is spent on
waiting, and the calls that succeed keep the limit at least 90 % busy.

The suite runs it shortened: the issue's one-minute windows, but 180 jobs (two windows)
instead of 400 (`QUOTA_JOBS`, `QUOTA_WINDOW_SECONDS` set them). Half-minute windows were
tried and dropped: the second of a waiting job to reach a worker after the reset is a
fixed cost that weighs twice as much in a window half as long. With
`QUOTA_COMPARE=1` it also runs with the quotas off, for the comparison in
`benchmarks/results/upstream-quotas.md`."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.types import JobType
from tests.faults.harness import FaultStack, seed, statuses, try_rows
from tests.waiting import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit, pytest.mark.timeout(1200)]

JOBS = int(os.environ.get("QUOTA_JOBS", "180"))
WINDOW = float(os.environ.get("QUOTA_WINDOW_SECONDS", "60"))
REQUESTS_PER_MINUTE, TOKENS_PER_MINUTE = 120, 40_000
MODES = ["on", "off"] if os.environ.get("QUOTA_COMPARE") else ["on"]


@pytest.mark.parametrize("quotas", MODES)
async def test_two_workers_share_the_ai_quota_without_429s_or_spent_tries(
    stack: FaultStack, db: async_sessionmaker[AsyncSession], tmp_path: Path, quotas: str
) -> None:
    per_window = WINDOW / 60
    requests, tokens = (
        round(REQUESTS_PER_MINUTE * per_window),
        round(TOKENS_PER_MINUTE * per_window),
    )
    stack.ai.enforce_limits(requests=requests, tokens=tokens, window=WINDOW)
    env = {"WORKER_PREFETCH": "10", "UPSTREAM_QUOTAS": "true" if quotas == "on" else "false"}
    stack.start("relay")
    stack.start("ai-worker", **env)
    stack.start("ai-worker", **env)
    started = time.monotonic()
    seeded = await seed(db, JOBS, [JobType.SCRAP_REFINE], label="quota")

    async def all_settled() -> bool:
        counts = await statuses(db, seeded.job_ids)
        return counts.get("COMPLETED", 0) + counts.get("FAILED", 0) == JOBS

    await eventually(
        all_settled,
        within=JOBS * 60 / REQUESTS_PER_MINUTE * 3 + 60,
        what="every job settled",
        interval=0.5,
        context=lambda: stack.logs(tail=1500),
    )
    elapsed = time.monotonic() - started
    counts = await statuses(db, seeded.job_ids)
    outcomes = Counter(row["outcome"] for row in await try_rows(db, seeded.job_ids))
    answered = sorted(stack.ai.answered_at)
    calls = len(answered) + stack.ai.limited
    usage = stack.ai.reported_usage
    tokens_per_call = sum(usage.values()) / max(1, len(answered))
    # The limit that binds: requests, or tokens at the calls' average size.
    limit_per_minute = min(REQUESTS_PER_MINUTE, TOKENS_PER_MINUTE / tokens_per_call)
    # The rate from the first call until the last window opened: the windows before it,
    # with the idle time between them (a window opens at its first call).
    last_window = stack.ai.window_starts[-1]
    before_last = sum(1 for at in answered if at < last_window)
    span = last_window - answered[0]
    rate = before_last / span * 60 if span > 0 else 0.0
    figures = (
        f"quotas {quotas}: {JOBS} jobs, window {WINDOW:.0f}s, {counts}, {calls} calls, "
        f"{stack.ai.limited} 429s ({stack.ai.limited / max(1, calls):.1%}), "
        f"tries {dict(outcomes)}, "
        f"{tokens_per_call:.0f} tokens/call, {rate:.1f} calls/min against a limit of "
        f"{limit_per_minute:.1f} ({rate / limit_per_minute:.0%}), {elapsed:.0f}s in all"
    )
    print(figures)
    (tmp_path / "figures.txt").write_text(figures + "\n")
    if quotas == "off":
        # The comparison: the fake really limits, so without the quotas 429s come back.
        assert stack.ai.limited > 0.02 * calls, figures
        return
    assert counts == {"COMPLETED": JOBS}, figures
    assert stack.ai.limited <= 0.02 * calls, figures
    assert outcomes["retry"] == 0 and outcomes["timed_out"] == 0, figures
    assert rate >= 0.9 * limit_per_minute, figures
