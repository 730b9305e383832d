"""Reading the upstreams' rate-limit headers into a budget (san_common.quotas)."""

from __future__ import annotations

import pytest

from san_common import quotas


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1m30.5s", 90.5), ("2", 2.0), ("1h", 3600.0)],
)
def test_openai_reset_durations_are_read(text: str, seconds: float) -> None:
    assert quotas.duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5x", "1s garbage", None])
def test_an_unreadable_reset_is_unknown(text: str | None) -> None:
    assert quotas.duration(text) is None


def test_openai_headers_become_the_budget_and_a_429_empties_it() -> None:
    headers = {
        "x-ratelimit-limit-requests": "120",
        "x-ratelimit-remaining-requests": "117",
        "x-ratelimit-reset-requests": "1.5s",
        "x-ratelimit-limit-tokens": "40000",
        "x-ratelimit-remaining-tokens": "39000",
        "x-ratelimit-reset-tokens": "900ms",
        "retry-after": "3",
    }
    ok = quotas.openai_answer(headers, 200, used_tokens=321)
    assert (ok.requests_limit, ok.requests_remaining, ok.requests_reset) == (120, 117, 1.5)
    assert (ok.tokens_limit, ok.tokens_remaining, ok.tokens_reset) == (40000, 39000, 0.9)
    assert (ok.retry_after, ok.used_tokens) == (None, 321)
    assert quotas.openai_answer(headers, 429, None).retry_after == 3.0


def test_github_reset_is_an_epoch_and_counts_from_now() -> None:
    said = quotas.github_answer(
        {"x-ratelimit-remaining": "5", "x-ratelimit-reset": "1000", "x-ratelimit-limit": "60"},
        200,
        now=990.0,
    )
    assert (said.requests_remaining, said.requests_reset, said.requests_limit) == (5, 10.0, 60)


def test_the_estimate_counts_the_prompt_and_an_answer_allowance() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}
    embedding = {"model": "e", "input": "y" * 400}
    assert quotas.estimate_call_tokens(chat) > 100 + quotas.COMPLETION_ALLOWANCE - 1
    assert quotas.estimate_call_tokens(embedding) == 100


def test_a_github_token_is_never_part_of_its_key() -> None:
    key = quotas.github_key("https://api.github.com/", "ghp_secret")
    assert "ghp_secret" not in key
    assert key == quotas.github_key("https://api.github.com/", "ghp_secret")
