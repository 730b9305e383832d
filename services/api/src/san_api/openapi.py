"""An OpenAPI description that tells the truth (docs/reference/job-rules.md §6): every operation
lists the problem+json answers it can give, with one shared `Problem` schema.

Two sources, merged per status code:
- what the route declares about its own domain errors: `responses=problems(NotFound, …)`;
- what follows from the route's shape, added here to every operation, including ones added
  later: parameters or a body → 400 (validation; FastAPI's fictional 422
  `HTTPValidationError` is removed); a body → 408, 413; a bearer token → 401, 503 (the
  database); path parameters → 404; a `job_limits` dependency → 429 with `Retry-After`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, routing
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi

from san_api.errors import PROBLEM_JSON, AppError
from san_api.limits.dependencies import JobQuota, RateLimit

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details, with a stable `code`",
    "type": "object",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string", "description": "Stable, machine-readable error code"},
        "instance": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
        "retryAfterSeconds": {"type": "integer"},
    },
    "additionalProperties": True,
}
RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying",
        "schema": {"type": "integer"},
    }
}
_SHAPE: dict[int, str] = {
    400: "VALIDATION_ERROR: the input does not validate",
    401: "UNAUTHORIZED: no, invalid or expired bearer token",
    404: "NOT_FOUND: no such resource for this user",
    408: "REQUEST_TIMEOUT: the body did not arrive in time",
    413: "CONTENT_TOO_LARGE: the body or content is over its limit",
    429: "RATE_LIMITED, TOO_MANY_ACTIVE_JOBS, BUDGET_EXCEEDED (AI jobs; with `resetsAt`):"
    " retry after `Retry-After` seconds",
    503: "DATABASE_UNAVAILABLE: retry after `Retry-After` seconds",
}
_WITH_RETRY_AFTER = {429, 503}


def problems(*errors: type[AppError]) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: its domain errors, grouped by status."""
    grouped: dict[int, list[type[AppError]]] = {}
    for error in errors:
        grouped.setdefault(error.status, []).append(error)
    return {
        status: _problem_response("; ".join(f"{e.code}: {e.title}" for e in group), status)
        for status, group in sorted(grouped.items())
    }


def _problem_response(description: str, status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": description,
        "content": {PROBLEM_JSON: {"schema": PROBLEM_REF}},
    }
    if status in _WITH_RETRY_AFTER:
        response["headers"] = RETRY_AFTER
    return response


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            app.openapi_schema = describe_problems(schema, _limited_operations(app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _limited_operations(routes: Sequence[Any]) -> set[tuple[str, str]]:
    # the same walk over (possibly included) routers as FastAPI's own get_openapi, so the
    # paths agree with the description's; a context reads as its route as included
    limited: set[tuple[str, str]] = set()
    for context in routing.iter_route_contexts(routes):
        path = context.path_format
        if (
            isinstance(context.original_route, routing.APIRoute)
            and path is not None
            and _has_limits(context.dependant)
        ):
            limited.update((path, method.lower()) for method in context.methods or ())
    return limited


def _has_limits(dependant: Dependant) -> bool:
    return any(
        isinstance(d.call, RateLimit | JobQuota) or _has_limits(d) for d in dependant.dependencies
    )


def describe_problems(schema: dict[str, Any], limited: set[tuple[str, str]]) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    components["Problem"] = PROBLEM_SCHEMA
    for path, item in schema.get("paths", {}).items():
        for method, operation in item.items():
            if method not in {"get", "put", "post", "delete", "patch"}:
                continue
            _describe_operation(path, method, operation, (path, method) in limited)
    return schema


def _describe_operation(path: str, method: str, operation: dict[str, Any], limited: bool) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    fictional = responses.get("422", {}).get("content", {}).get("application/json", {})
    if fictional.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
        del responses["422"]
    parameters = operation.get("parameters", [])
    shape: list[int] = []
    if parameters or "requestBody" in operation:
        shape.append(400)
    if "requestBody" in operation:
        shape += [408, 413]
    if operation.get("security"):
        shape += [401, 503]
    if any(p.get("in") == "path" for p in parameters):
        shape.append(404)
    if limited:
        shape.append(429)
    for status in shape:
        key = str(status)
        if key not in responses:
            responses[key] = _problem_response(_SHAPE[status], status)
        elif _SHAPE[status] not in responses[key].get("description", ""):
            responses[key]["description"] = f"{responses[key]['description']}; {_SHAPE[status]}"
    for key, response in responses.items():
        if key.isdigit() and int(key) >= 400:
            content = response.setdefault("content", {})
            if not content or PROBLEM_JSON in content:  # not a route's own error format
                content.setdefault(PROBLEM_JSON, {}).setdefault("schema", PROBLEM_REF)
                if int(key) in _WITH_RETRY_AFTER:
                    response.setdefault("headers", RETRY_AFTER)
