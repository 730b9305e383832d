"""Acceptance 2: the operator role guards every /admin route and action; every action
leaves an audit row."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
from fastapi.routing import APIRoute

from san_api.app import create_app
from tests.admin.support import Sessions, insert_jobs, new_user, operator_headers, user_headers
from tests.api.support import assert_problem
from tests.conftest import api_settings

# The login form is the way in: it shows a form and nothing else (its POST is guarded).
OPEN = {("GET", "/admin/login")}


def _flat(routes: list[Any]) -> Iterator[tuple[str, set[str]]]:
    """(path, methods) of every API route; FastAPI ≥ 0.16x keeps included routers lazily."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route.path, set(route.methods)
        elif hasattr(route, "effective_route_contexts"):
            for context in route.effective_route_contexts():
                original = context.original_route
                if isinstance(original, APIRoute):
                    yield context.path, set(original.methods)


def admin_routes() -> list[tuple[str, str]]:
    app = create_app(api_settings("postgresql://unused/db", "amqp://unused"))
    routes = []
    for path, methods in _flat(app.routes):
        if path.startswith("/admin"):
            for method in sorted(methods - {"HEAD"}):
                if (method, path) not in OPEN:
                    routes.append((method, path))
    return routes


def concrete(path: str) -> str:
    """Fill path parameters with valid values, so the request reaches the role check."""
    path = path.replace("{jobId}", str(uuid.uuid4())).replace("{jobType}", "CARD_ANALYSIS")
    path = path.replace("{userId}", str(uuid.uuid4()))
    assert not re.search(r"\{\w+\}", path), f"unknown path parameter in {path}"
    return path


def test_the_walk_covers_the_api_and_the_console() -> None:
    routes = admin_routes()
    paths = {p for _, p in routes}
    assert len(routes) >= 25, routes
    assert any(p.startswith("/admin/api/") for p in paths)
    assert any(not p.startswith("/admin/api") for p in paths), "console pages"
    assert ("POST", "/admin/api/jobs/{jobId}/retry") in routes


async def test_a_non_operator_gets_403_on_every_admin_route(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    _, external = await new_user(sessions)
    headers = user_headers(external)
    for method, path in admin_routes():
        response = await api.request(method, concrete(path), headers=headers, json={})
        assert_problem(response, 403, "FORBIDDEN"), (method, path)
        # the console's cookie carries the same token: same answer
        cookie = {"Cookie": f"san_admin={headers['Authorization'].removeprefix('Bearer ')}"}
        response = await api.request(method, concrete(path), headers=cookie, json={})
        assert response.status_code == 403, (method, path, response.text)


async def test_no_token_is_401_for_the_api_and_a_login_redirect_for_pages(
    api: httpx.AsyncClient,
) -> None:
    for method, path in admin_routes():
        response = await api.request(method, concrete(path), json={})
        if path.startswith("/admin/api"):
            assert_problem(response, 401, "UNAUTHORIZED")
        elif path == "/admin/login":  # not from the console's own page (test_csrf.py)
            assert_problem(response, 403, "CROSS_ORIGIN_REFUSED")
        else:
            assert response.status_code in (303, 401), (method, path, response.status_code)
    bad = {"Authorization": "Bearer not-a-jwt"}
    assert_problem(await api.get("/admin/api/jobs", headers=bad), 401, "UNAUTHORIZED")


async def test_every_action_writes_its_audit_row(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    name = f"op-{uuid.uuid4().hex[:8]}"
    headers = operator_headers(name)
    [failed] = await insert_jobs(sessions, user_id)
    [pending] = await insert_jobs(sessions, user_id, status="PENDING")
    actions = [
        ("POST", f"/admin/api/jobs/{failed}/retry", None),
        ("POST", f"/admin/api/jobs/{pending}/cancel", None),
        ("POST", "/admin/api/jobs/bulk", {"action": "cancel", "filter": {"user": external}}),
        ("POST", "/admin/api/jobs/bulk", {"action": "retry", "filter": {"user": external}}),
        ("POST", "/admin/api/job-types/SCRAP_REFINE/pause", None),
        ("POST", "/admin/api/job-types/SCRAP_REFINE/resume", None),
        ("POST", "/admin/api/sweeps/run", {"sweeps": ["ghost"]}),
    ]
    for method, path, body in actions:
        response = await api.request(method, path, headers=headers, json=body)
        assert response.status_code in (200, 202), (path, response.text)
    audit = (await api.get("/admin/api/audit", headers=headers)).json()["items"]
    mine = [a["action"] for a in audit if a["actor"] == name]
    assert sorted(mine) == sorted(
        [
            "job.retry",
            "job.cancel",
            "jobs.bulk_cancel",
            "jobs.bulk_retry",
            "job_type.pause",
            "job_type.resume",
            "sweeps.run",
        ]
    )
