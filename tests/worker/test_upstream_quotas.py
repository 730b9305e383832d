"""The shared budget itself (san_common.quotas) against real PostgreSQL: what it admits
before anything is known, what an answer teaches it, what a 429 does, and that a
reservation nobody settled is forgotten when its window ends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from san_common.db.engine import create_engine
from san_common.quotas import NO_STATIC, Answer, QuotaWait, Static, UpstreamQuotas

KEY = "ai http://fake/v1 model"


@pytest.fixture
async def engine(fresh_db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(fresh_db_url, pool_size=4)
    yield engine
    await engine.dispose()


async def admitted(quotas: UpstreamQuotas, tokens: int = 0, static: Static = NO_STATIC) -> bool:
    try:
        await quotas.reserve(KEY, tokens, static)
    except QuotaWait:
        return False
    return True


async def test_an_unknown_budget_lets_one_probe_go_until_an_answer_says(
    engine: AsyncEngine,
) -> None:
    quotas = UpstreamQuotas(engine)
    assert await admitted(quotas)
    with pytest.raises(QuotaWait) as waiting:
        await quotas.reserve(KEY, 0, NO_STATIC)
    assert waiting.value.retry_after == pytest.approx(1.0, abs=0.1)  # soon, not the probe's 30 s
    assert await admitted(quotas) is False
    await quotas.settle(KEY, 0, Answer(requests_remaining=3, requests_reset=30))
    assert [await admitted(quotas) for _ in range(4)] == [True, True, True, False]


async def test_answers_in_flight_lower_what_the_headers_say(engine: AsyncEngine) -> None:
    quotas = UpstreamQuotas(engine)
    static = Static(requests=100)
    assert [await admitted(quotas, static=static) for _ in range(3)] == [True] * 3
    # The upstream says 9 left (not the 97 assumed): the two calls still in flight were
    # not counted in it yet.
    await quotas.settle(KEY, 0, Answer(requests_remaining=9, requests_reset=60))
    assert sum([await admitted(quotas, static=static) for _ in range(10)]) == 7


async def test_a_429_empties_the_budget_until_its_retry_after(engine: AsyncEngine) -> None:
    quotas = UpstreamQuotas(engine)
    static = Static(requests=100)
    assert await admitted(quotas, static=static)
    await quotas.settle(KEY, 0, Answer(retry_after=0.5))
    with pytest.raises(QuotaWait) as waiting:
        await quotas.reserve(KEY, 0, static)
    assert 0 < (waiting.value.retry_after or 0) <= 0.5
    await asyncio.sleep(0.6)
    assert await admitted(quotas, static=static)  # refilled to the static limit


async def test_tokens_are_estimated_then_settled_with_the_reported_usage(
    engine: AsyncEngine,
) -> None:
    quotas = UpstreamQuotas(engine)
    static = Static(tokens=1000)
    assert await admitted(quotas, 600, static)
    assert await admitted(quotas, 600, static) is False  # 400 left of the estimate
    await quotas.settle(KEY, 600, Answer(used_tokens=150))  # it cost less: 850 left
    assert await admitted(quotas, 800, static)


async def test_a_reservation_nobody_settled_is_forgotten_when_its_window_ends(
    engine: AsyncEngine,
) -> None:
    quotas = UpstreamQuotas(engine, probe_seconds=0.5)
    assert await admitted(quotas)  # the probe's worker dies: never settled
    assert await admitted(quotas) is False
    await asyncio.sleep(0.6)
    assert await admitted(quotas)
