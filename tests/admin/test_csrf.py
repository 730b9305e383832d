"""Console CSRF (docs/security.md, "Console CSRF"): an unsafe request under /admin that
carries the operator's cookie (or an authenticating proxy's header) is refused with 403 and
changes nothing unless it shows it comes from the console's own origin; `POST /admin/login`
likewise (login CSRF); a bearer token is accepted from anywhere. The test walks the route
table, so a route added later is covered without being listed here."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy import text

from san_api.app import create_app
from san_api.auth.tokens import OPERATOR_ROLE, mint
from tests.admin.support import Sessions, insert_jobs, new_user, operator_headers
from tests.admin.test_access import admin_routes, concrete
from tests.api.support import assert_problem, in_process
from tests.conftest import JWT_SECRET, api_settings

UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
# A form a page elsewhere could make the browser send: every field any console form reads.
BODY = "action=cancel&status=PENDING&status=FAILED&sweep=ghost&token=t&all=1"
ATTACKS = {
    "another-site": {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
    "a-sibling-subdomain": {"Origin": "http://evil.san.example", "Sec-Fetch-Site": "same-site"},
    "another-port": {"Origin": "http://api:8081", "Sec-Fetch-Site": "same-site"},
    "an-old-browser": {"Origin": "http://evil.example"},  # no fetch metadata: Origin decides
    "a-sandboxed-frame": {"Origin": "null"},
    "no-origin-at-all": {},
}
TABLES = (
    "async_jobs",
    "admin_audit",
    "job_type_pauses",
    "recovery_sweep_requests",
    "outbox_messages",
)


async def snapshot(sessions: Sessions) -> dict[str, str | None]:
    """Every row of the tables an /admin action writes, as one digest per table."""
    async with sessions() as session:
        return {
            table: await session.scalar(
                text(f"SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM {table} t")
            )
            for table in TABLES
        }


def _cookie(token: str) -> dict[str, str]:
    return {"Cookie": f"san_admin={token}"}


def test_the_walk_covers_every_unsafe_console_and_api_route() -> None:
    unsafe = [(m, p) for m, p in admin_routes() if m in UNSAFE]
    assert ("POST", "/admin/login") in unsafe
    assert ("POST", "/admin/jobs/bulk") in unsafe and ("POST", "/admin/sweeps/run") in unsafe
    assert any(p.startswith("/admin/api/") for _, p in unsafe)
    assert len(unsafe) >= 15, unsafe


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_a_cross_origin_form_post_to_every_unsafe_admin_route_is_403_and_changes_nothing(
    api: httpx.AsyncClient, sessions: Sessions, attack: str
) -> None:
    user_id, _ = await new_user(sessions)
    await insert_jobs(sessions, user_id, 3, status="PENDING")
    await insert_jobs(sessions, user_id, 3, status="FAILED")
    operator = mint(JWT_SECRET, f"op-{uuid.uuid4().hex[:8]}", role=OPERATOR_ROLE)
    before = await snapshot(sessions)

    for method, path in admin_routes():
        if method not in UNSAFE:
            continue
        headers = {**_cookie(operator), **FORM, **ATTACKS[attack]}
        response = await api.request(method, concrete(path), headers=headers, content=BODY)
        assert_problem(response, 403, "CROSS_ORIGIN_REFUSED"), (method, path)
        assert "set-cookie" not in response.headers, (method, path)
    # login CSRF: signing the browser in to someone's account needs no cookie to begin with
    login = await api.post(
        "/admin/login", headers={**FORM, **ATTACKS[attack]}, content=f"token={operator}"
    )
    assert_problem(login, 403, "CROSS_ORIGIN_REFUSED")
    assert "set-cookie" not in login.headers

    assert await snapshot(sessions) == before


async def test_the_same_origin_console_works_and_a_bearer_token_works_from_anywhere(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    operator = mint(JWT_SECRET, f"op-{uuid.uuid4().hex[:8]}", role=OPERATOR_ROLE)
    own_page = {**_cookie(operator), **FORM, "Sec-Fetch-Site": "same-origin"}
    old_browser = {**_cookie(operator), **FORM, "Origin": "http://api"}  # the client's origin

    login = await api.post(
        "/admin/login",
        headers={**FORM, "Sec-Fetch-Site": "same-origin"},
        content=f"token={operator}",
    )
    assert login.status_code == 303 and "san_admin=" in login.headers["set-cookie"]
    paused = await api.post("/admin/job-types/SCRAP_REFINE/pause", headers=own_page)
    assert paused.status_code == 303, paused.text
    resumed = await api.post("/admin/job-types/SCRAP_REFINE/resume", headers=old_browser)
    assert resumed.status_code == 303, resumed.text

    anywhere = {
        **operator_headers(),
        "Origin": "http://evil.example",
        "Sec-Fetch-Site": "cross-site",
    }
    for action in ("pause", "resume"):
        response = await api.post(f"/admin/api/job-types/SCRAP_REFINE/{action}", headers=anywhere)
        assert response.status_code == 200, response.text

    async with sessions() as session:
        audit = (await session.scalars(text("SELECT action FROM admin_audit ORDER BY id"))).all()
    assert audit == ["job_type.pause", "job_type.resume", "job_type.pause", "job_type.resume"]


async def test_an_authenticating_proxys_header_is_ambient_too(
    db_url: str, amqp_url: str, sessions: Sessions
) -> None:
    settings = api_settings(db_url, amqp_url, admin_proxy_header="X-Forwarded-User")
    async with in_process(create_app(settings)) as api:
        proxied = {"X-Forwarded-User": "alice", **FORM}
        refused = await api.post(
            "/admin/sweeps/run", headers={**proxied, **ATTACKS["another-site"]}, content=BODY
        )
        assert_problem(refused, 403, "CROSS_ORIGIN_REFUSED")
        done = await api.post(
            "/admin/sweeps/run",
            headers={**proxied, "Sec-Fetch-Site": "same-origin"},
            content="sweep=ghost",
        )
        assert done.status_code == 303, done.text
    async with sessions() as session:
        requests = await session.scalar(text("SELECT count(*) FROM recovery_sweep_requests"))
    assert requests == 1


@pytest.mark.parametrize(("env", "secure"), [("test", True), ("development", False)])
async def test_the_console_cookie_is_secure_except_in_local_development(
    db_url: str, amqp_url: str, env: str, secure: bool
) -> None:
    """Over plain http (as behind a TLS-terminating proxy the API does not trust): the
    cookie is `Secure` anyway, except in local development."""
    settings = api_settings(db_url, amqp_url, san_env=env)
    operator = mint(JWT_SECRET, "op-cookie", role=OPERATOR_ROLE)
    async with in_process(create_app(settings)) as api:
        login = await api.post(
            "/admin/login",
            headers={**FORM, "Sec-Fetch-Site": "same-origin"},
            content=f"token={operator}",
        )
    assert login.status_code == 303, login.text
    attributes = [a.strip().lower() for a in login.headers["set-cookie"].split(";")]
    assert ("secure" in attributes) is secure, attributes
    assert {"httponly", "samesite=strict", "path=/admin"} <= set(attributes)
