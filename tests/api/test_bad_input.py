"""Bad input answers 4xx problem+json with a stable code and writes nothing
(docs/reference/job-rules.md §3.1, §6)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from san_api.settings import ApiSettings
from tests.api.support import (
    PROBLEM_JSON,
    Sessions,
    api_with,
    assert_problem,
    footprint,
    save_scrap,
    subject_of,
)

JSON = {"content-type": "application/json"}

# (id, request kwargs, expected code, words the detail must contain)
BAD_SCRAP_BODIES: list[tuple[str, dict[str, Any], str, str]] = [
    ("empty-content", {"json": {"content": ""}}, "VALIDATION_ERROR", "empty"),
    ("whitespace-only", {"json": {"content": "  \r\n\t "}}, "VALIDATION_ERROR", "empty"),
    ("only-newlines", {"json": {"content": "\r\n\r\n\n\r"}}, "VALIDATION_ERROR", "empty"),
    # zero-width space, joiner, non-joiner, BOM, word joiner, soft hyphen, bidi marks
    (
        "only-zero-width",
        {"json": {"content": "\u200b\u200d \u200c\ufeff\u2060\u00ad\u200e\u202e"}},
        "VALIDATION_ERROR",
        "visible text",
    ),
    (
        "zero-width-and-spaces",
        {"json": {"content": " \u200b\n\u200b "}},
        "VALIDATION_ERROR",
        "visible",
    ),
    ("hangul-fillers", {"json": {"content": "\u3164\u115f\u2800"}}, "VALIDATION_ERROR", "visible"),
    (
        "malformed-json",
        {"content": b'{"content": "abc"', "headers": JSON},
        "VALIDATION_ERROR",
        "JSON",
    ),
    ("not-json-at-all", {"content": b"content=abc", "headers": JSON}, "VALIDATION_ERROR", "JSON"),
    ("content-number", {"json": {"content": 123}}, "VALIDATION_ERROR", "content"),
    ("content-null", {"json": {"content": None}}, "VALIDATION_ERROR", "content"),
    ("content-list", {"json": {"content": ["a"]}}, "VALIDATION_ERROR", "content"),
    ("content-object", {"json": {"content": {"text": "a"}}}, "VALIDATION_ERROR", "content"),
    ("content-bool", {"json": {"content": True}}, "VALIDATION_ERROR", "content"),
    ("body-array", {"json": []}, "VALIDATION_ERROR", "body"),
    ("body-string", {"json": "just text"}, "VALIDATION_ERROR", "body"),
    ("body-null", {"content": b"null", "headers": JSON}, "VALIDATION_ERROR", "body"),
    ("empty-object", {"json": {}}, "VALIDATION_ERROR", "content"),
    ("extra-field", {"json": {"content": "ok", "userId": "x"}}, "VALIDATION_ERROR", "userId"),
    ("missing-body", {}, "VALIDATION_ERROR", "body"),
    ("empty-body", {"content": b"", "headers": JSON}, "VALIDATION_ERROR", "body"),
    ("nul-in-content", {"json": {"content": "a\x00b"}}, "VALIDATION_ERROR", "NUL"),
    (
        "lone-surrogate",
        {"content": b'{"content": "abc \\ud800 def"}', "headers": JSON},
        "VALIDATION_ERROR",
        "content",
    ),
]


@pytest.fixture
async def user_with_a_scrap(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> dict[str, str]:
    """A provisioned user who already saved one scrap (so their rows are non-zero)."""
    headers = new_user()
    await save_scrap(api, headers)
    return headers


@pytest.mark.parametrize(
    ("request_kwargs", "code", "detail_words"),
    [pytest.param(kw, code, words, id=case) for case, kw, code, words in BAD_SCRAP_BODIES],
)
async def test_bad_scrap_body_is_rejected_and_writes_nothing(
    api: httpx.AsyncClient,
    sessions: Sessions,
    user_with_a_scrap: dict[str, str],
    request_kwargs: dict[str, Any],
    code: str,
    detail_words: str,
) -> None:
    headers = user_with_a_scrap
    subject = subject_of(headers)
    before = await footprint(sessions, subject)
    assert before.scraps == 1 and before.jobs == 2 and before.outbox == 2

    kwargs = dict(request_kwargs)
    kwargs["headers"] = {**kwargs.get("headers", {}), **headers}
    response = await api.post("/scraps", **kwargs)

    body = assert_problem(response, 400, code)
    assert detail_words.lower() in body["detail"].lower(), body
    assert body["instance"] == "/scraps"
    assert await footprint(sessions, subject) == before


async def test_bad_input_from_a_brand_new_user_writes_no_scrap_job_or_outbox_row(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    response = await api.post("/scraps", json={"content": " \n "}, headers=headers)
    assert_problem(response, 400, "VALIDATION_ERROR")
    after = await footprint(sessions, subject_of(headers))
    assert (after.scraps, after.jobs, after.outbox) == (0, 0, 0)


@pytest.fixture
async def small_api(
    settings_for: Callable[..., ApiSettings],
) -> AsyncIterator[httpx.AsyncClient]:
    """The API with a 10-byte scrap limit and a 2 KiB request-body limit."""
    async with api_with(settings_for(scrap_max_bytes=10, request_max_bytes=2048)) as client:
        yield client


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("x" * 11, id="ascii-11-bytes"),
        pytest.param("é" * 6, id="6-chars-12-bytes"),
        pytest.param("  " + "y" * 11 + " \r\n", id="11-bytes-after-trim"),
    ],
)
async def test_content_over_the_scrap_limit_is_413(
    small_api: httpx.AsyncClient,
    sessions: Sessions,
    new_user: Callable[[], dict[str, str]],
    content: str,
) -> None:
    headers = new_user()
    await save_scrap(small_api, headers, "ok")
    before = await footprint(sessions, subject_of(headers))

    response = await small_api.post("/scraps", json={"content": content}, headers=headers)

    body = assert_problem(response, 413, "CONTENT_TOO_LARGE")
    assert "10 bytes" in body["detail"], body
    assert await footprint(sessions, subject_of(headers)) == before


async def test_the_scrap_limit_counts_normalized_bytes(
    small_api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    """Exactly the limit after CRLF→LF and trimming is accepted."""
    headers = new_user()
    response = await small_api.post(
        "/scraps", json={"content": "   12345\r\n789 \r\n\t"}, headers=headers
    )
    assert response.status_code == 202, response.text


async def test_request_body_over_the_limit_is_413(
    small_api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    await save_scrap(small_api, headers, "ok")
    before = await footprint(sessions, subject_of(headers))

    response = await small_api.post("/scraps", json={"content": "z" * 4096}, headers=headers)

    body = assert_problem(response, 413, "CONTENT_TOO_LARGE")
    assert "2048" in body["detail"], body
    assert await footprint(sessions, subject_of(headers)) == before


async def test_chunked_request_body_over_the_limit_is_413(
    small_api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    """Without a Content-Length the limit is enforced while the body streams in."""
    headers = new_user()
    await save_scrap(small_api, headers, "ok")
    before = await footprint(sessions, subject_of(headers))

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"content": "'
        for _ in range(8):
            yield b"z" * 1024
        yield b'"}'

    response = await small_api.post("/scraps", content=chunks(), headers={**headers, **JSON})

    assert "content-length" not in response.request.headers
    body = assert_problem(response, 413, "CONTENT_TOO_LARGE")
    assert "2048" in body["detail"], body
    assert await footprint(sessions, subject_of(headers)) == before


async def test_request_body_over_the_default_limit_is_413(
    api: httpx.AsyncClient, user_with_a_scrap: dict[str, str], sessions: Sessions
) -> None:
    subject = subject_of(user_with_a_scrap)
    before = await footprint(sessions, subject)
    response = await api.post(
        "/scraps", json={"content": "w" * 1_000_001}, headers=user_with_a_scrap
    )
    assert_problem(response, 413, "CONTENT_TOO_LARGE")
    assert await footprint(sessions, subject) == before


SOME_ID = "6f1c2a7e-0b4d-4c51-9a43-2f0e8d7b5c10"
BAD_READS = [
    pytest.param("/async-jobs/not-a-uuid", "jobId", id="job-id-word"),
    pytest.param("/async-jobs/12345", "jobId", id="job-id-number"),
    pytest.param(f"/async-jobs/{SOME_ID}x", "jobId", id="job-id-uuid-plus-char"),
    pytest.param("/cards/not-a-uuid", "scrapId", id="scrap-id-word"),
    pytest.param("/cards/42", "scrapId", id="scrap-id-number"),
    pytest.param("/cards/not-a-uuid/similar-cards", "cardId", id="card-id-word"),
    pytest.param("/cards/7/similar-cards", "cardId", id="card-id-number"),
    pytest.param(f"/cards/{SOME_ID}/similar-cards?limit=0", "limit", id="limit-zero"),
    pytest.param(f"/cards/{SOME_ID}/similar-cards?limit=-3", "limit", id="limit-negative"),
    pytest.param(f"/cards/{SOME_ID}/similar-cards?limit=101", "limit", id="limit-over-max"),
    pytest.param(f"/cards/{SOME_ID}/similar-cards?limit=ten", "limit", id="limit-word"),
    pytest.param(f"/cards/{SOME_ID}/similar-cards?limit=2.5", "limit", id="limit-float"),
    pytest.param(f"/cards/{SOME_ID}/similar-cards?limit=", "limit", id="limit-empty"),
]


@pytest.mark.parametrize(("path", "field"), BAD_READS)
async def test_bad_ids_and_queries_are_400(
    api: httpx.AsyncClient,
    sessions: Sessions,
    user_with_a_scrap: dict[str, str],
    path: str,
    field: str,
) -> None:
    subject = subject_of(user_with_a_scrap)
    before = await footprint(sessions, subject)

    response = await api.get(path, headers=user_with_a_scrap)

    body = assert_problem(response, 400, "VALIDATION_ERROR")
    assert field in body["detail"], body
    assert [error["field"].split(".")[-1] for error in body["errors"]] == [field]
    assert await footprint(sessions, subject) == before


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/no-such-route"),
        ("POST", "/scrap"),
        ("GET", "/cards"),
        ("GET", f"/cards/{SOME_ID}/similar-cards/extra"),
        ("GET", f"/async-jobs/{SOME_ID}/tries"),
    ],
)
async def test_unknown_route_is_404_problem(
    api: httpx.AsyncClient, user_with_a_scrap: dict[str, str], method: str, path: str
) -> None:
    response = await api.request(method, path, headers=user_with_a_scrap)
    body = assert_problem(response, 404, "NOT_FOUND")
    assert body["instance"] == path.split("?")[0]


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/scraps", "POST"),
        ("DELETE", "/scraps", "POST"),
        ("PUT", f"/async-jobs/{SOME_ID}", "GET"),
        ("DELETE", f"/cards/{SOME_ID}", "GET"),
        ("POST", f"/cards/{SOME_ID}/similar-cards", "GET"),
        ("POST", "/healthz", "GET"),
    ],
)
async def test_wrong_method_is_405_problem_with_allow(
    api: httpx.AsyncClient,
    sessions: Sessions,
    user_with_a_scrap: dict[str, str],
    method: str,
    path: str,
    allowed: str,
) -> None:
    subject = subject_of(user_with_a_scrap)
    before = await footprint(sessions, subject)
    response = await api.request(
        method, path, json={"content": "via wrong method"}, headers=user_with_a_scrap
    )
    assert_problem(response, 405, "METHOD_NOT_ALLOWED")
    # RFC 9110 §15.5.6: a 405 MUST say which methods the resource supports
    assert allowed in response.headers.get("allow", ""), response.headers
    assert await footprint(sessions, subject) == before


async def test_problem_responses_are_json_even_when_the_client_asks_for_html(
    api: httpx.AsyncClient, user_with_a_scrap: dict[str, str]
) -> None:
    response = await api.post(
        "/scraps",
        json={"content": ""},
        headers={**user_with_a_scrap, "accept": "text/html"},
    )
    assert response.headers["content-type"].startswith(PROBLEM_JSON)
    assert response.json()["code"] == "VALIDATION_ERROR"


async def test_a_body_with_thousands_of_invalid_fields_gets_a_bounded_answer(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    body = {f"k{i}": i for i in range(5_000)}
    response = await api.post("/scraps", json=body, headers=new_user())
    assert response.status_code == 400
    problem = response.json()
    assert problem["code"] == "VALIDATION_ERROR"
    assert 0 < len(problem["errors"]) <= 20


@pytest.mark.parametrize(
    "content", ["a\u200bb", "\u200b한\u200b", "emoji 👩\u200d💻", "\u05d0\u200f", "x"]
)
async def test_text_with_visible_characters_and_zero_width_ones_is_saved_as_sent(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]], content: str
) -> None:
    saved = await save_scrap(api, new_user(), content)
    assert saved["analysisJobId"] is not None
