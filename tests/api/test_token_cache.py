"""Verified tokens are remembered for `AUTH_JWT_CACHE_SECONDS`, never past their expiry
(san_api/auth/cache.py)."""

from __future__ import annotations

import asyncio
import time

import jwt
import pytest

from san_api.auth.cache import VerifiedTokens
from san_api.auth.tokens import InvalidToken, TokenVerifier
from tests.conftest import JWT_SECRET


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_is_kept_until_its_expiry_or_the_ttl_whichever_comes_first() -> None:
    clock = Clock()
    tokens: VerifiedTokens[str] = VerifiedTokens(ttl=30, clock=clock)
    tokens.remember("expires-soon", "a", expires_at=clock.now + 5)
    tokens.remember("lives-long", "b", expires_at=clock.now + 3600)
    clock.now += 4.9
    assert (tokens.get("expires-soon"), tokens.get("lives-long")) == ("a", "b")
    clock.now += 0.1  # the first token's expiry
    assert (tokens.get("expires-soon"), tokens.get("lives-long")) == (None, "b")
    clock.now += 25  # 30 s after both were verified
    assert tokens.get("lives-long") is None
    assert tokens.get("never-seen") is None


def test_the_cache_is_bounded_and_a_ttl_of_zero_keeps_nothing() -> None:
    clock = Clock()
    tokens: VerifiedTokens[int] = VerifiedTokens(ttl=30, capacity=3, clock=clock)
    for n in range(5):
        tokens.remember(f"t{n}", n, expires_at=clock.now + 60)
    assert [tokens.get(f"t{n}") for n in range(5)] == [None, None, 2, 3, 4]

    off: VerifiedTokens[int] = VerifiedTokens(ttl=0, clock=clock)
    off.remember("t", 1, expires_at=clock.now + 60)
    assert off.get("t") is None


def test_a_cached_token_is_refused_once_it_expires() -> None:
    verifier = TokenVerifier(
        secret=JWT_SECRET, max_lifetime_seconds=3600, leeway_seconds=0, cache_seconds=60
    )
    expires = time.time() + 1.0
    token = jwt.encode({"sub": "soon", "exp": expires}, JWT_SECRET, "HS256")
    assert asyncio.run(verifier.verify(token)) == "soon"
    assert asyncio.run(verifier.verify(token)) == "soon"  # from the cache
    time.sleep(max(0.0, expires - time.time()) + 0.1)
    with pytest.raises(InvalidToken, match="expired"):
        asyncio.run(verifier.verify(token))
