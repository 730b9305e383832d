"""Tokens of an external identity provider: RS256 keys from a JWKS (file or URL, cached,
rotated), and the optional `iss`/`aud` checks."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from san_api.auth.jwks import JwksKeys
from san_api.auth.tokens import InvalidToken, TokenVerifier
from tests.api.support import api_with, assert_problem
from tests.api.test_auth import _hs256, _in
from tests.conftest import JWT_SECRET


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _jwk(key: rsa.RSAPrivateKey, kid: str) -> dict[str, Any]:
    jwk: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "use": "sig", "alg": "RS256"}


def _rs256(key: rsa.RSAPrivateKey, kid: str, **claims: object) -> str:
    body = {"sub": "idp-" + uuid.uuid4().hex, "exp": _in(600), **claims}
    return jwt.encode(body, key, "RS256", headers={"kid": kid})


async def test_jwks_file_mode_accepts_the_providers_tokens_only(
    settings_for: Any, tmp_path: Path
) -> None:
    key, stranger = _rsa(), _rsa()
    keys_file = tmp_path / "jwks.json"
    keys_file.write_text(json.dumps({"keys": [_jwk(key, "k1")]}))
    settings = settings_for(
        auth_jwt_jwks_file=str(keys_file),
        auth_jwt_issuer="https://idp.test/",
        auth_jwt_audience="san-api",
    )
    good = {"iss": "https://idp.test/", "aud": "san-api"}
    async with api_with(settings) as api:

        async def me(token: str) -> httpx.Response:
            return await api.get("/me", headers={"Authorization": f"Bearer {token}"})

        assert (await me(_rs256(key, "k1", **good))).status_code == 200
        refused = {
            "unknown key": _rs256(stranger, "k1", **good),
            "unknown kid": _rs256(stranger, "k9", **good),
            "HS256 with the API secret": _hs256({"sub": "x", "exp": _in(600), **good}),
            "wrong issuer": _rs256(key, "k1", iss="https://evil.test/", aud="san-api"),
            "no issuer": _rs256(key, "k1", aud="san-api"),
            "wrong audience": _rs256(key, "k1", iss="https://idp.test/", aud="other"),
            "no audience": _rs256(key, "k1", iss="https://idp.test/"),
        }
        for why, token in refused.items():
            response = await me(token)
            assert response.status_code == 401, why
            assert_problem(response, 401, "UNAUTHORIZED")
        assert "issuer" in (await me(refused["wrong issuer"])).json()["detail"]
        assert "audience" in (await me(refused["wrong audience"])).json()["detail"]


async def test_jwks_url_is_cached_and_a_rotated_key_is_fetched_once() -> None:
    old, new = _rsa(), _rsa()
    published = {"keys": [_jwk(old, "old")]}
    fetches = 0

    def serve(request: httpx.Request) -> httpx.Response:
        nonlocal fetches
        fetches += 1
        return httpx.Response(200, json=published)

    jwks = JwksKeys(
        url="https://idp.test/jwks.json",
        min_refresh_seconds=0,
        transport=httpx.MockTransport(serve),
    )
    verifier = TokenVerifier(
        secret=JWT_SECRET, max_lifetime_seconds=3600, jwks=jwks, algorithms=("RS256",)
    )
    try:
        for _ in range(3):
            await verifier.verify(_rs256(old, "old"))
        assert fetches == 1  # cached

        published = {"keys": [_jwk(old, "old"), _jwk(new, "new")]}  # the provider rotates
        await verifier.verify(_rs256(new, "new"))
        assert fetches == 2  # the unknown kid made one refresh
        await verifier.verify(_rs256(new, "new"))
        await verifier.verify(_rs256(old, "old"))
        assert fetches == 2
    finally:
        await jwks.aclose()


async def test_made_up_kids_do_not_hammer_the_provider() -> None:
    key = _rsa()
    fetches = 0

    def serve(request: httpx.Request) -> httpx.Response:
        nonlocal fetches
        fetches += 1
        return httpx.Response(200, json={"keys": [_jwk(key, "k1")]})

    jwks = JwksKeys(
        url="https://idp.test/jwks.json",
        min_refresh_seconds=3600,
        transport=httpx.MockTransport(serve),
    )
    verifier = TokenVerifier(
        secret=JWT_SECRET, max_lifetime_seconds=3600, jwks=jwks, algorithms=("RS256",)
    )
    try:
        for n in range(5):
            with pytest.raises(InvalidToken, match="signing key"):
                await verifier.verify(_rs256(key, f"made-up-{n}"))
        assert fetches == 1
    finally:
        await jwks.aclose()


async def test_an_unreachable_provider_refuses_tokens_with_401_not_500(settings_for: Any) -> None:
    jwks = JwksKeys(
        url="https://idp.test/jwks.json",
        transport=httpx.MockTransport(lambda request: httpx.Response(503)),
    )
    verifier = TokenVerifier(
        secret=JWT_SECRET, max_lifetime_seconds=3600, jwks=jwks, algorithms=("RS256",)
    )
    try:
        with pytest.raises(InvalidToken, match="cannot be read"):
            await verifier.verify(_rs256(_rsa(), "k1"))
    finally:
        await jwks.aclose()


def test_jwks_settings_refuse_symmetric_algorithms_and_two_sources(settings_for: Any) -> None:
    with pytest.raises(ValueError, match="asymmetric"):
        settings_for(auth_jwt_jwks_url="https://idp.test/jwks", auth_jwt_algorithms="HS256")
    with pytest.raises(ValueError, match="not both"):
        settings_for(auth_jwt_jwks_url="https://idp.test/jwks", auth_jwt_jwks_file="/x")


def test_the_lifetime_counts_from_iat_and_has_leeway() -> None:
    verifier = TokenVerifier(secret=JWT_SECRET, max_lifetime_seconds=3600, leeway_seconds=30)

    async def check(claims: dict[str, object]) -> str:
        return await verifier.verify(jwt.encode(claims, JWT_SECRET, "HS256"))

    import asyncio

    now = int(time.time())
    assert asyncio.run(check({"sub": "a", "iat": now, "exp": now + 3600})) == "a"
    assert asyncio.run(check({"sub": "a", "iat": now, "exp": now + 3620})) == "a"
    with pytest.raises(InvalidToken, match="maximum"):
        asyncio.run(check({"sub": "a", "iat": now - 7000, "exp": now + 100}))


def test_san_token_refuses_a_lifetime_the_api_would_refuse(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from san_api.auth import mint

    monkeypatch.setenv("AUTH_JWT_SECRET", JWT_SECRET)
    monkeypatch.setenv("AUTH_JWT_MAX_LIFETIME_SECONDS", "3600")
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as exited:
        mint.main(["someone", "--ttl-hours", "2"])
    assert exited.value.code == 2
    assert "AUTH_JWT_MAX_LIFETIME_SECONDS" in capsys.readouterr().err
    mint.main(["someone", "--ttl-hours", "1"])
    token = capsys.readouterr().out.strip()
    assert jwt.decode(token, JWT_SECRET, algorithms=["HS256"])["sub"] == "someone"
