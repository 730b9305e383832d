"""No input produces a 500 (docs/reference/job-rules.md §6): a broad list of hostile requests, each
answered below 500, and every error as problem+json. The in-process client re-raises an app
exception, so a crash fails the test even where no 500 response is produced."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import jwt
import pytest

from tests.api.support import PROBLEM_JSON
from tests.conftest import JWT_SECRET

ID = "6f1c2a7e-0b4d-4c51-9a43-2f0e8d7b5c10"
JSON = {"content-type": "application/json"}


def _signed(claims: dict[str, object]) -> dict[str, str]:
    return {"Authorization": "Bearer " + jwt.encode(claims, JWT_SECRET, "HS256")}


def _alg_none(claims: dict[str, object]) -> dict[str, str]:
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return {"Authorization": f"Bearer {part({'alg': 'none'})}.{part(claims)}."}


Headers = dict[str, str]
# (id, method, path, kwargs built from a valid user's headers)
HOSTILE: list[tuple[str, str, str, Callable[[Headers], dict[str, Any]]]] = [
    # bodies
    ("nul-in-content", "POST", "/scraps", lambda h: {"json": {"content": "a\x00b"}, "headers": h}),
    (
        "lone-surrogates",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"content": "\\udfff\\ud800"}', "headers": {**h, **JSON}},
    ),
    (
        "invalid-utf8",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"content": "\xff\xfe\xc0"}', "headers": {**h, **JSON}},
    ),
    (
        "utf16-body",
        "POST",
        "/scraps",
        lambda h: {"content": '{"content": "hi"}'.encode("utf-16"), "headers": {**h, **JSON}},
    ),
    (
        "bom-prefixed-json",
        "POST",
        "/scraps",
        lambda h: {"content": b'\xef\xbb\xbf{"content": "x"}', "headers": {**h, **JSON}},
    ),
    (
        "unicode-and-bidi",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "한국어 🚀 \u202e\u2066 Ω\ufeff"}, "headers": h},
    ),
    (
        "zero-width-only",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "\u200b\u200d\u2060"}, "headers": h},
    ),
    (
        "very-deep-array",
        "POST",
        "/scraps",
        lambda h: {"content": b"[" * 200_000, "headers": {**h, **JSON}},
    ),
    (
        "very-deep-in-content",
        "POST",
        "/scraps",
        lambda h: {
            "content": b'{"content": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            "headers": {**h, **JSON},
        },
    ),
    (
        "deep-object",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"a":' * 900 + b"1" + b"}" * 900, "headers": {**h, **JSON}},
    ),
    (
        "json-nan",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"content": NaN}', "headers": {**h, **JSON}},
    ),
    (
        "json-infinity",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"content": -Infinity}', "headers": {**h, **JSON}},
    ),
    (
        "json-5000-digit-int",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"content": 1' + b"0" * 5000 + b"}", "headers": {**h, **JSON}},
    ),
    (
        "json-duplicate-keys",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"content": "a", "content": 5}', "headers": {**h, **JSON}},
    ),
    (
        "many-keys",
        "POST",
        "/scraps",
        lambda h: {"json": {f"k{i}": i for i in range(20_000)}, "headers": h},
    ),
    # content types
    (
        "text-plain",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"content": "x"}', "headers": {**h, "content-type": "text/plain"}},
    ),
    ("form-urlencoded", "POST", "/scraps", lambda h: {"data": {"content": "x"}, "headers": h}),
    (
        "multipart",
        "POST",
        "/scraps",
        lambda h: {"files": {"content": ("a.txt", b"x")}, "headers": h},
    ),
    (
        "xml",
        "POST",
        "/scraps",
        lambda h: {
            "content": b"<content>x</content>",
            "headers": {**h, "content-type": "application/xml"},
        },
    ),
    (
        "garbage-content-type",
        "POST",
        "/scraps",
        lambda h: {"content": b'{"content": "x"}', "headers": {**h, "content-type": ";;==/\x7f"}},
    ),
    (
        "json-charset-latin1",
        "POST",
        "/scraps",
        lambda h: {
            "content": '{"content": "café"}'.encode("latin-1"),
            "headers": {**h, "content-type": "application/json; charset=latin-1"},
        },
    ),
    # ids and queries
    ("numeric-job-id", "GET", "/async-jobs/1234567890", lambda h: {"headers": h}),
    ("negative-card-id", "GET", "/cards/-1", lambda h: {"headers": h}),
    ("float-card-id", "GET", "/cards/1.5e308/similar-cards", lambda h: {"headers": h}),
    ("braced-uuid", "GET", "/async-jobs/{" + ID + "}", lambda h: {"headers": h}),
    ("urn-uuid", "GET", f"/cards/urn:uuid:{ID}", lambda h: {"headers": h}),
    (
        "nil-uuid",
        "GET",
        "/cards/00000000-0000-0000-0000-000000000000/similar-cards",
        lambda h: {"headers": h},
    ),
    ("encoded-nul-id", "GET", "/cards/%00", lambda h: {"headers": h}),
    (
        "encoded-traversal",
        "GET",
        "/cards/..%2F..%2Fetc%2Fpasswd/similar-cards",
        lambda h: {"headers": h},
    ),
    ("very-long-path", "GET", "/cards/" + "a" * 20_000, lambda h: {"headers": h}),
    ("unicode-path", "GET", "/cards/ünïcødé/similar-cards", lambda h: {"headers": h}),
    (
        "limit-huge",
        "GET",
        f"/cards/{ID}/similar-cards?limit=" + "9" * 5000,
        lambda h: {"headers": h},
    ),
    (
        "limit-repeated",
        "GET",
        f"/cards/{ID}/similar-cards?limit=1&limit=x",
        lambda h: {"headers": h},
    ),
    ("limit-nul", "GET", f"/cards/{ID}/similar-cards?limit=%00", lambda h: {"headers": h}),
    # headers and tokens
    (
        "huge-header",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "x"}, "headers": {**h, "x-junk": "x" * 100_000}},
    ),
    (
        "many-headers",
        "GET",
        f"/async-jobs/{ID}",
        lambda h: {"headers": {**h, **{f"x-h{i}": "v" for i in range(2000)}}},
    ),
    (
        "huge-bearer-token",
        "POST",
        "/scraps",
        lambda h: {
            "json": {"content": "x"},
            "headers": {"Authorization": "Bearer " + "a" * 200_000},
        },
    ),
    (
        "non-ascii-authorization",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "x"}, "headers": {"Authorization": b"Bearer \xff\xfe\x80"}},
    ),
    (
        "alg-none-token",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "x"}, "headers": _alg_none({"sub": "admin"})},
    ),
    (
        "sub-with-nul",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "x"}, "headers": _signed({"sub": "a\x00b"})},
    ),
    (
        "sub-lone-surrogate",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "x"}, "headers": _signed({"sub": "\udc80"})},
    ),
    (
        "sub-10k-chars",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "x"}, "headers": _signed({"sub": "s" * 10_000})},
    ),
    (
        "exp-not-a-number",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "x"}, "headers": _signed({"sub": "s", "exp": "soon"})},
    ),
    (
        "exp-huge",
        "POST",
        "/scraps",
        lambda h: {"json": {"content": "x"}, "headers": _signed({"sub": "s", "exp": 10**30})},
    ),
    # methods
    ("head-scraps", "HEAD", "/scraps", lambda h: {"headers": h}),
    ("options-card", "OPTIONS", f"/cards/{ID}", lambda h: {"headers": h}),
    ("trace", "TRACE", "/healthz", lambda h: {}),
    ("propfind", "PROPFIND", "/scraps", lambda h: {"headers": h}),
]


@pytest.mark.parametrize(
    ("method", "path", "build"), [pytest.param(m, p, b, id=i) for i, m, p, b in HOSTILE]
)
async def test_hostile_request_is_answered_below_500(
    api: httpx.AsyncClient,
    new_user: Callable[[], dict[str, str]],
    method: str,
    path: str,
    build: Callable[[Headers], dict[str, Any]],
) -> None:
    response = await api.request(method, path, **build(new_user()))
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith(PROBLEM_JSON), response.headers
        if method != "HEAD":
            assert response.json()["status"] == response.status_code
