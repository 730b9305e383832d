"""The usage ledger (issue 39, acceptance 1): every answered AI call is a ledger row whose
tokens are the answer's `usage` and whose cost follows the price table; `GET /me/usage`
and the jobs' details read the same rows."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select

from san_common import metrics
from san_common.models import AiUsage
from san_common.usage import AiCall, TryUsage, ledger
from tests.usage.conftest import PRICES, System
from tests.waiting import settled_job_via_api

pytestmark = pytest.mark.rabbit

SCRAPS = 20


def priced(prompt: int, completion: int, embedding: int) -> Decimal:
    chat, embed = PRICES.by_model["gpt-4o-mini"], PRICES.by_model["text-embedding-3-small"]
    return (prompt * chat.input + completion * chat.output + embedding * embed.input) / Decimal(
        1_000_000
    )


async def post_scraps(system: System, headers: dict[str, str], n: int) -> list[str]:
    job_ids = []
    for i in range(n):
        content = f"Scrap {i} about PostgreSQL and vector search {uuid.uuid4().hex}" + " x" * i
        response = await system.api.post("/scraps", json={"content": content}, headers=headers)
        assert response.status_code == 202, response.text
        body = response.json()
        job_ids += [body["analysisJobId"], body["refineJobId"]]
    return job_ids


async def test_twenty_scraps_ledger_equals_the_ai_reported_usage_and_the_price_table(
    system: System,
) -> None:
    headers = system.headers(f"ledger-{uuid.uuid4().hex}")
    cost_before = metrics.AI_COST.labels("gpt-4o-mini", "CARD_ANALYSIS")._value.get()
    job_ids = await post_scraps(system, headers, SCRAPS)
    details = [await settled_job_via_api(system.api, headers, j) for j in job_ids]
    assert all(d["status"] == "COMPLETED" for d in details), details

    reported = system.ai.reported_usage
    ledger = await system.ledger()
    assert ledger["rows"] == 3 * SCRAPS  # card analysis: chat + embedding; refine: chat
    assert (ledger["prompt"], ledger["completion"], ledger["embedding"]) == (
        reported["prompt"],
        reported["completion"],
        reported["embedding"],
    )
    assert reported["prompt"] > 3 * SCRAPS  # not the constant of a fake that ignores input
    assert ledger["cost"] == priced(
        reported["prompt"], reported["completion"], reported["embedding"]
    )
    async with system.sessions() as session:
        estimated = await session.scalar(select(AiUsage.id).where(AiUsage.estimated))
    assert estimated is None

    # The job details, summed, and /me/usage say the same as the ledger.
    usages = [
        (await system.api.get(f"/async-jobs/{j}", headers=headers)).json()["usage"] for j in job_ids
    ]
    summed = {
        key: sum(u[key] for u in usages)
        for key in ("promptTokens", "completionTokens", "embeddingTokens")
    }
    assert summed == {
        "promptTokens": ledger["prompt"],
        "completionTokens": ledger["completion"],
        "embeddingTokens": ledger["embedding"],
    }
    assert sum(u["costUsd"] for u in usages) == pytest.approx(float(ledger["cost"]), abs=1e-9)
    assert all(
        u["embeddingTokens"] == 0
        for d, u in zip(details, usages, strict=True)
        if d["jobType"] == "SCRAP_REFINE"
    )

    report = (await system.api.get("/me/usage", headers=headers)).json()
    total = report["total"]
    assert {k: total[k] for k in summed} == summed
    assert total["costUsd"] == pytest.approx(float(ledger["cost"]), abs=1e-9)
    by_type: dict[str, Any] = {d["jobType"]: d for d in report["days"]}
    assert set(by_type) == {"CARD_ANALYSIS", "SCRAP_REFINE"}
    assert by_type["CARD_ANALYSIS"]["jobs"] == by_type["SCRAP_REFINE"]["jobs"] == SCRAPS

    # Another user's usage is not this user's.
    other = (await system.api.get("/me/usage", headers=system.headers("ledger-other"))).json()
    assert other["days"] == [] and other["total"]["promptTokens"] == 0
    # Prometheus counts the cost by model and job type.
    cost_after = metrics.AI_COST.labels("gpt-4o-mini", "CARD_ANALYSIS")._value.get()
    assert cost_after > cost_before


async def test_answers_without_usage_are_estimated_and_marked(system: System) -> None:
    system.ai.usage_supported = False
    try:
        headers = system.headers(f"estimate-{uuid.uuid4().hex}")
        job_ids = await post_scraps(system, headers, 1)
        for job_id in job_ids:
            assert (await settled_job_via_api(system.api, headers, job_id))["status"] == "COMPLETED"
    finally:
        system.ai.usage_supported = True
    async with system.sessions() as session:
        rows = (await session.scalars(select(AiUsage))).all()
    assert len(rows) == 3
    assert all(r.estimated for r in rows)
    assert all(r.prompt_tokens + r.embedding_tokens > 0 for r in rows)
    assert all(r.completion_tokens > 0 for r in rows if r.call == "chat")


async def test_me_usage_rejects_a_bad_range(system: System) -> None:
    headers = system.headers("range")
    bad = await system.api.get(
        "/me/usage", params={"from": "2025-02-01", "to": "2025-01-01"}, headers=headers
    )
    assert bad.status_code == 400, bad.text
    long = await system.api.get(
        "/me/usage", params={"from": "2020-01-01", "to": "2025-01-01"}, headers=headers
    )
    assert long.status_code == 400, long.text
    garbage = await system.api.get("/me/usage", params={"from": "yesterday"}, headers=headers)
    assert garbage.status_code == 400, garbage.text


async def test_a_try_s_calls_written_again_are_counted_once(system: System) -> None:
    """A worker holding a result through an outage writes its try's calls again when a
    commit's answer was lost (tests/faults/test_store_outage.py): the ledger keeps the first
    write and skips the rest, whichever statement they come in."""
    job_id, user_id = uuid.uuid4(), uuid.uuid4()
    calls = [
        AiCall("gpt-4o-mini", "chat", 100, 20, 0, False, 5, Decimal("0.0003")),
        AiCall("text-embedding-3-small", "embedding", 0, 0, 40, False, 2, Decimal(0)),
    ]
    first = TryUsage(job_id, 1, user_id, "CARD_ANALYSIS", calls)
    second_try = TryUsage(job_id, 2, user_id, "CARD_ANALYSIS", calls[:1])
    async with system.sessions() as session, session.begin():
        assert await ledger.insert(session, [first]) == 2
    async with system.sessions() as session, session.begin():
        await ledger.insert(session, [first, second_try])  # first again, beside a new try
    async with system.sessions() as session:
        rows = (await session.scalars(select(AiUsage).where(AiUsage.job_id == job_id))).all()
    assert sorted((r.try_no, r.call) for r in rows) == [(1, "chat"), (1, "embedding"), (2, "chat")]
