"""The OpenAPI description tells the truth about errors (the schemathesis run in
tests/fuzz checks every answer against it; these pin the shape of the description)."""

from __future__ import annotations

from typing import Any

import httpx

PROBLEM = {"$ref": "#/components/schemas/Problem"}


async def _spec(api: httpx.AsyncClient) -> dict[str, Any]:
    response = await api.get("/openapi.json")
    assert response.status_code == 200
    spec: dict[str, Any] = response.json()
    return spec


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
    ]


async def test_no_fictional_422_and_one_problem_schema(api: httpx.AsyncClient) -> None:
    spec = await _spec(api)
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    assert spec["components"]["schemas"]["Problem"]["required"] == [
        "type",
        "title",
        "status",
        "detail",
        "code",
    ]
    for method, path, operation in _operations(spec):
        for status, response in operation["responses"].items():
            if int(status) >= 400 and path != "/readyz":
                content = response["content"]["application/problem+json"]
                assert content["schema"] == PROBLEM, (method, path, status)
        if operation.get("parameters") or "requestBody" in operation:
            assert "400" in operation["responses"], (method, path)
        if operation.get("security"):
            assert {"401", "503"} <= operation["responses"].keys(), (method, path)
            assert "Retry-After" in operation["responses"]["503"]["headers"]


async def test_job_creating_operations_document_429_with_retry_after(
    api: httpx.AsyncClient,
) -> None:
    spec = await _spec(api)
    limited = {
        (method, path)
        for method, path, operation in _operations(spec)
        if "429" in operation["responses"]
    }
    assert {
        ("post", "/scraps"),
        ("post", "/til"),
        ("post", "/recall-quizzes"),
        ("post", "/til/{summaryId}/github-commits"),
        ("post", "/github-star-recommendations"),
    } <= limited
    assert ("get", "/me") not in limited
    scraps = spec["paths"]["/scraps"]["post"]["responses"]
    assert "RATE_LIMITED" in scraps["429"]["description"]
    assert "Retry-After" in scraps["429"]["headers"]
    commits = spec["paths"]["/til/{summaryId}/github-commits"]["post"]["responses"]
    assert "FILE_PATH_UNAVAILABLE" in commits["409"]["description"]
    assert "TIL_NOT_COMPLETED" in commits["400"]["description"]
    assert "VALIDATION_ERROR" in commits["400"]["description"]
