"""Tokens this process verified recently, so a client's next requests skip the signature
check (PyJWT's decode and HMAC/RSA verification: ~7 % of a request's CPU).

A token is kept for at most `ttl` seconds and never past its own expiry (`exp` plus the
leeway the verifier allows): a cached token is exactly as valid as it was when verified,
except that a key withdrawn from the identity provider's JWKS within the last `ttl`
seconds is still honoured for what remains of it — the JWKS cache itself already honours
a withdrawn key for up to `AUTH_JWT_JWKS_CACHE_SECONDS`. Only tokens that verified are
kept (a flood of bad tokens cannot fill the cache), and it is bounded: the oldest entries
go first. `ttl` 0 turns caching off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

C = TypeVar("C")


class VerifiedTokens(Generic[C]):
    def __init__(
        self, ttl: float, capacity: int = 10_000, clock: Callable[[], float] = time.time
    ) -> None:
        self._ttl = ttl
        self._capacity = capacity
        self._clock = clock
        self._entries: dict[str, tuple[C, float]] = {}

    def get(self, token: str) -> C | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        claims, valid_until = entry
        if self._clock() >= valid_until:
            del self._entries[token]
            return None
        return claims

    def remember(self, token: str, claims: C, expires_at: float) -> None:
        """`claims` of a token that just verified, valid until `expires_at` (epoch s)."""
        if self._ttl <= 0:
            return
        self._entries[token] = (claims, min(expires_at, self._clock() + self._ttl))
        if len(self._entries) > self._capacity:
            del self._entries[next(iter(self._entries))]
