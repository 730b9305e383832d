"""Signing keys of an external identity provider (a JWKS), from a URL or a file.

The key set is cached for `cache_seconds`. A token whose `kid` is not in the cached set
makes one early refresh (the provider rotated its keys), but at most one every
`min_refresh_seconds`, so tokens with made-up `kid`s cannot make us hammer the provider.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import jwt


class KeysUnavailable(Exception):
    pass


class JwksKeys:
    def __init__(
        self,
        *,
        url: str = "",
        file: str = "",
        cache_seconds: float = 300.0,
        min_refresh_seconds: float = 30.0,
        timeout_seconds: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if bool(url) == bool(file):
            raise ValueError("a JWKS comes from exactly one of a URL or a file")
        self._url, self._file = url, file
        self._cache_seconds, self._min_refresh = cache_seconds, min_refresh_seconds
        self._http = (
            httpx.AsyncClient(timeout=timeout_seconds, transport=transport) if url else None
        )
        self._keys: dict[str, jwt.PyJWK] = {}
        self._loaded_at = -float("inf")
        self._lock = asyncio.Lock()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    async def key(self, kid: str | None) -> Any:
        """The verification key for `kid` (or the only key, when the token names none)."""
        now = time.monotonic()
        if now - self._loaded_at > self._cache_seconds:
            await self._refresh(now)
        found = self._pick(kid)
        if found is None and now - self._loaded_at >= self._min_refresh:
            await self._refresh(now)
            found = self._pick(kid)
        if found is None:
            raise KeysUnavailable("the token's signing key is not one the identity provider lists")
        return found.key

    def _pick(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is not None:
            return self._keys.get(kid)
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    async def _refresh(self, now: float) -> None:
        async with self._lock:
            if self._loaded_at >= now:  # another request refreshed while we waited
                return
            try:
                document = await self._fetch()
                keys = jwt.PyJWKSet.from_dict(document).keys
            except (OSError, ValueError, httpx.HTTPError, jwt.PyJWKSetError) as exc:
                if not self._keys:
                    raise KeysUnavailable("the identity provider's keys cannot be read") from exc
                return  # keep serving the keys we have; try again after min_refresh
            finally:
                self._loaded_at = time.monotonic()
            self._keys = {k.key_id or f"#{i}": k for i, k in enumerate(keys)}

    async def _fetch(self) -> dict[str, Any]:
        if self._http is not None:
            response = await self._http.get(self._url)
            response.raise_for_status()
            document = response.json()
        else:
            text = await asyncio.to_thread(Path(self._file).read_text, encoding="utf-8")
            document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("a JWKS is a JSON object")
        return document
