"""Bearer-token authentication (docs/reference/job-rules.md §4, §8): every failure is a 401 problem
with `WWW-Authenticate: Bearer` and provisions nothing; a valid token provisions its user once."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from collections.abc import Callable

import httpx
import jwt
import pytest
from sqlalchemy import func, select

from san_common.models import Scrap, User
from tests.api.support import Footprint, Sessions, assert_problem, footprint, save_scrap
from tests.conftest import JWT_SECRET

OTHER_SECRET = "another-secret-" + "y" * 40


def _hs256(claims: dict[str, object], secret: str = JWT_SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(claims, secret, algorithm)


def _unsigned(claims: dict[str, object]) -> str:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def _tampered(subject: str) -> str:
    """A genuine token for someone else whose payload was swapped for `subject`."""
    header, _, signature = _hs256({"sub": "someone-else", "exp": _in(600)}).split(".")
    payload = _unsigned({"sub": subject, "exp": _in(600)}).split(".")[1]
    return f"{header}.{payload}.{signature}"


def _in(seconds: int) -> int:
    return int(time.time()) + seconds


# Each case builds an Authorization header (or None) for a subject of its own.
AuthCase = Callable[[str], str | None]
BAD_AUTH: list[tuple[str, AuthCase]] = [
    ("missing", lambda sub: None),
    ("basic-scheme", lambda sub: "Basic " + base64.b64encode(f"{sub}:pw".encode()).decode()),
    ("token-scheme", lambda sub: "Token " + _hs256({"sub": sub, "exp": _in(600)})),
    ("bearer-without-token", lambda sub: "Bearer "),
    ("bare-token-no-scheme", lambda sub: _hs256({"sub": sub, "exp": _in(600)})),
    ("garbage", lambda sub: "Bearer not.a.jwt"),
    ("garbage-base64", lambda sub: "Bearer " + base64.b64encode(sub.encode()).decode()),
    (
        "forged-other-secret",
        lambda sub: "Bearer " + _hs256({"sub": sub, "exp": _in(600)}, OTHER_SECRET),
    ),
    ("expired", lambda sub: "Bearer " + _hs256({"sub": sub, "exp": _in(-3600)})),
    ("not-yet-valid", lambda sub: "Bearer " + _hs256({"sub": sub, "nbf": _in(3600)})),
    ("no-exp", lambda sub: "Bearer " + _hs256({"sub": sub})),
    ("too-long-lived", lambda sub: "Bearer " + _hs256({"sub": sub, "exp": _in(90 * 86400)})),
    (
        "too-long-lived-by-iat",
        lambda sub: "Bearer " + _hs256({"sub": sub, "iat": _in(-3600), "exp": _in(86400)}),
    ),
    (
        "issued-in-the-future",
        lambda sub: "Bearer " + _hs256({"sub": sub, "iat": _in(3600), "exp": _in(7200)}),
    ),
    ("no-sub", lambda sub: "Bearer " + _hs256({"exp": _in(600), "name": sub})),
    ("empty-sub", lambda sub: "Bearer " + _hs256({"sub": "", "exp": _in(600)})),
    ("blank-sub", lambda sub: "Bearer " + _hs256({"sub": "  \t ", "exp": _in(600)})),
    ("numeric-sub", lambda sub: "Bearer " + _hs256({"sub": 12345, "exp": _in(600)})),
    ("object-sub", lambda sub: "Bearer " + _hs256({"sub": {"id": sub}, "exp": _in(600)})),
    ("oversized-sub", lambda sub: "Bearer " + _hs256({"sub": sub + "x" * 300, "exp": _in(600)})),
    ("nul-in-sub", lambda sub: "Bearer " + _hs256({"sub": sub + "\x00", "exp": _in(600)})),
    ("surrogate-in-sub", lambda sub: "Bearer " + _hs256({"sub": sub + "\ud800", "exp": _in(600)})),
    ("alg-none", lambda sub: "Bearer " + _unsigned({"sub": sub, "exp": _in(600)})),
    (
        "alg-hs384",
        lambda sub: "Bearer " + _hs256({"sub": sub, "exp": _in(600)}, JWT_SECRET, "HS384"),
    ),
    ("tampered-payload", lambda sub: "Bearer " + _tampered(sub)),
]


async def _scrap_count_with_content(sessions: Sessions, content: str) -> int:
    digest = hashlib.sha256(content.encode()).hexdigest()
    async with sessions() as session:
        count = await session.scalar(
            select(func.count()).select_from(Scrap).where(Scrap.content_hash == digest)
        )
    return int(count or 0)


@pytest.mark.parametrize("authorization", [pytest.param(f, id=i) for i, f in BAD_AUTH])
async def test_bad_credentials_are_401_and_provision_nothing(
    api: httpx.AsyncClient, sessions: Sessions, authorization: AuthCase
) -> None:
    subject = "intruder-" + uuid.uuid4().hex
    content = f"written by {subject}"
    header = authorization(subject)
    headers = {} if header is None else {"Authorization": header}

    response = await api.post("/scraps", json={"content": content}, headers=headers)

    body = assert_problem(response, 401, "UNAUTHORIZED")
    assert response.headers["www-authenticate"] == "Bearer"
    assert "token" in body["detail"].lower()
    assert JWT_SECRET not in response.text
    assert await footprint(sessions, subject) == Footprint(users=0, scraps=0, jobs=0, outbox=0)
    assert await _scrap_count_with_content(sessions, content) == 0


async def test_an_expired_token_says_so(api: httpx.AsyncClient) -> None:
    token = _hs256({"sub": "late-" + uuid.uuid4().hex, "exp": _in(-120)})
    response = await api.post(
        "/scraps", json={"content": "late"}, headers={"Authorization": f"Bearer {token}"}
    )
    body = assert_problem(response, 401, "UNAUTHORIZED")
    assert "expired" in body["detail"]


@pytest.mark.parametrize(
    "path",
    [
        "/async-jobs/6f1c2a7e-0b4d-4c51-9a43-2f0e8d7b5c10",
        "/cards/6f1c2a7e-0b4d-4c51-9a43-2f0e8d7b5c10",
        "/cards/6f1c2a7e-0b4d-4c51-9a43-2f0e8d7b5c10/similar-cards",
    ],
)
async def test_reads_need_a_token(api: httpx.AsyncClient, path: str) -> None:
    response = await api.get(path)
    assert_problem(response, 401, "UNAUTHORIZED")
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/openapi.json", "/docs", "/metrics"])
async def test_health_and_docs_need_no_token(api: httpx.AsyncClient, path: str) -> None:
    response = await api.get(path)
    assert response.status_code == 200, response.text


async def test_a_valid_token_provisions_its_user_once(
    api: httpx.AsyncClient, sessions: Sessions, token: Callable[[str], str]
) -> None:
    subject = "first-time-" + uuid.uuid4().hex
    assert (await footprint(sessions, subject)).users == 0
    headers = {"Authorization": f"Bearer {token(subject)}"}

    first = await save_scrap(api, headers)
    second = await save_scrap(api, headers)

    async with sessions() as session:
        user_ids = list(await session.scalars(select(User.id).where(User.external_id == subject)))
        owners = set(
            await session.scalars(
                select(Scrap.user_id).where(Scrap.id.in_([first["scrapId"], second["scrapId"]]))
            )
        )
    assert len(user_ids) == 1
    assert owners == {user_ids[0]}


@pytest.mark.parametrize(
    ("claims", "says"),
    [
        ({}, "has no 'exp' claim"),
        ({"exp": 90 * 86400}, "longer than the maximum of 86400 seconds"),
        ({"exp": 600, "sub": "x" * 10_000}, "longer than 255 characters"),
        ({"exp": 600, "sub": " "}, "must not be empty"),
        ({"exp": 600, "sub": 7}, "must be a string"),
    ],
)
async def test_a_refused_token_says_why(
    api: httpx.AsyncClient, claims: dict[str, object], says: str
) -> None:
    full: dict[str, object] = {"sub": "why-" + uuid.uuid4().hex, **claims}
    if "exp" in full:
        full["exp"] = _in(int(str(full["exp"])))
    response = await api.get("/me", headers={"Authorization": f"Bearer {_hs256(full)}"})
    body = assert_problem(response, 401, "UNAUTHORIZED")
    assert says in body["detail"]


async def test_the_subject_is_case_sensitive_and_any_string(
    api: httpx.AsyncClient, sessions: Sessions, token: Callable[[str], str]
) -> None:
    base = "Üser/" + uuid.uuid4().hex + " with spaces@example.org"
    for subject in (base, base.upper()):
        await save_scrap(api, {"Authorization": f"Bearer {token(subject)}"})
    assert (await footprint(sessions, base)).users == 1
    assert (await footprint(sessions, base.upper())).users == 1


@pytest.mark.parametrize(
    ("claim", "value"),
    [
        ("exp", lambda: str(_in(600))),  # pyjwt takes any string int() takes
        ("exp", lambda: True),
        ("nbf", lambda: str(_in(-60))),
        ("nbf", lambda: [_in(-60)]),
        ("iat", lambda: str(_in(-60))),
        ("iat", lambda: {"at": _in(-60)}),
    ],
    ids=["exp-digits", "exp-bool", "nbf-digits", "nbf-list", "iat-digits", "iat-object"],
)
async def test_a_signed_token_with_a_mistyped_time_claim_is_401_with_the_reason(
    api: httpx.AsyncClient, claim: str, value: Callable[[], object]
) -> None:
    """A correctly signed token whose NumericDate claims are not numbers: 401 saying which
    claim, never a 500 (this used to be an `assert`, which `python -O` also strips)."""
    claims: dict[str, object] = {"sub": "typed-" + uuid.uuid4().hex, "exp": _in(600)}
    claims[claim] = value()
    response = await api.get("/me", headers={"Authorization": f"Bearer {_hs256(claims)}"})
    body = assert_problem(response, 401, "UNAUTHORIZED")
    assert f"'{claim}'" in body["detail"], body
