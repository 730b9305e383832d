"""Admin jobs: list with filters and cursor pagination, detail, retry (same id), cancel,
bulk by filter with a preview (acceptance 3); bad input is 4xx, never 5xx."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import func, select

from san_api.settings import ApiSettings
from san_common.models import AsyncJob, OutboxMessage
from tests.admin.support import Sessions, insert_jobs, new_user, operator_headers, user_headers
from tests.api.support import api_with, assert_problem

OP = operator_headers()


async def test_filters_and_cursor_pagination(api: httpx.AsyncClient, sessions: Sessions) -> None:
    user_id, external = await new_user(sessions)
    old = datetime.now(UTC) - timedelta(days=3)
    failed = await insert_jobs(sessions, user_id, 5, error="CARD_ANALYSIS failed: AI said 503")
    await insert_jobs(sessions, user_id, 2, status="COMPLETED", job_type="SCRAP_REFINE")
    await insert_jobs(sessions, user_id, 1, created_at=old, error="timeout")

    seen: list[str] = []
    cursor = None
    while True:
        params = {"user": external, "status": "FAILED", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        response = await api.get("/admin/api/jobs", params=params, headers=OP)
        assert response.status_code == 200, response.text
        page = response.json()
        seen += [j["jobId"] for j in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
    assert len(seen) == 6 and len(set(seen)) == 6  # every FAILED job once, newest first
    assert seen[-1] not in map(str, failed)  # the 3-day-old one comes last

    by = lambda **p: api.get("/admin/api/jobs", params={"user": external, **p}, headers=OP)  # noqa: E731
    assert len((await by(type="SCRAP_REFINE")).json()["items"]) == 2
    assert len((await by(error="ai SAID")).json()["items"]) == 5  # case-insensitive
    assert len((await by(error="%")).json()["items"]) == 0  # LIKE wildcards are literal
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert len((await by(createdFrom=since)).json()["items"]) == 7
    assert len((await by(status=["FAILED", "COMPLETED"])).json()["items"]) == 8


async def test_bad_list_input_is_400(api: httpx.AsyncClient) -> None:
    for params in (
        {"cursor": "not-a-cursor"},
        {"status": "NOPE"},
        {"limit": 0},
        {"createdFrom": "yesterday"},
        {"createdFrom": "2026-12-02T10:00:00"},  # no offset
        {"createdFrom": "2026-12-03T00:00:00Z", "createdTo": "2026-12-02T00:00:00Z"},
        {"error": "a\x00b"},
    ):
        response = await api.get("/admin/api/jobs", params=params, headers=OP)
        assert_problem(response, 400, "VALIDATION_ERROR")
    assert_problem(await api.get("/admin/api/jobs/not-a-uuid", headers=OP), 400, "VALIDATION_ERROR")
    assert_problem(await api.get(f"/admin/api/jobs/{uuid.uuid4()}", headers=OP), 404, "NOT_FOUND")


async def test_detail_shows_history_target_and_related(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    target = uuid.uuid4()
    [first] = await insert_jobs(sessions, user_id, target_id=target)
    [second] = await insert_jobs(sessions, user_id, target_id=target, status="COMPLETED")
    detail = (await api.get(f"/admin/api/jobs/{first}", headers=OP)).json()
    assert detail["job"]["user"] == external
    assert detail["job"]["errorMessage"] == "CARD_ANALYSIS failed: boom"
    assert [e["status"] for e in detail["events"]] == ["FAILED"]
    assert detail["target"] == {"table": "scraps", "exists": False, "status": None}
    assert [r["jobId"] for r in detail["related"]] == [str(second)]


async def test_retry_keeps_the_job_id_and_the_owner_sees_it(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    [job_id] = await insert_jobs(sessions, user_id)
    response = await api.post(f"/admin/api/jobs/{job_id}/retry", headers=OP)
    assert response.status_code == 200, response.text
    assert response.json()["jobId"] == str(job_id) and response.json()["status"] == "PENDING"
    owner = (await api.get(f"/async-jobs/{job_id}", headers=user_headers(external))).json()
    assert owner["status"] == "PENDING"
    async with sessions() as session:
        messages = await session.scalar(
            select(func.count())
            .select_from(OutboxMessage)
            .where(OutboxMessage.body["job_id"].astext == str(job_id))
        )
    assert messages == 1  # a new message for the same job id
    # not FAILED any more: a second retry is refused
    assert_problem(await api.post(f"/admin/api/jobs/{job_id}/retry", headers=OP), 409, "CONFLICT")


async def test_retry_respects_the_one_active_job_rule(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, _ = await new_user(sessions)
    target = uuid.uuid4()
    [failed] = await insert_jobs(sessions, user_id, target_id=target)
    await insert_jobs(sessions, user_id, target_id=target, status="PENDING")
    response = await api.post(f"/admin/api/jobs/{failed}/retry", headers=OP)
    assert_problem(response, 409, "DUPLICATE_RESOURCE")
    missing = await api.post(f"/admin/api/jobs/{uuid.uuid4()}/retry", headers=OP)
    assert_problem(missing, 404, "NOT_FOUND")


async def test_cancel_active_jobs_only(api: httpx.AsyncClient, sessions: Sessions) -> None:
    user_id, external = await new_user(sessions)
    [pending] = await insert_jobs(sessions, user_id, status="PENDING")
    [processing] = await insert_jobs(sessions, user_id, status="PROCESSING")
    [commit] = await insert_jobs(
        sessions, user_id, status="PROCESSING", job_type="TIL_GITHUB_COMMIT"
    )
    [completed] = await insert_jobs(sessions, user_id, status="COMPLETED")
    for job_id in (pending, processing):
        response = await api.post(f"/admin/api/jobs/{job_id}/cancel", headers=OP)
        assert response.status_code == 200 and response.json()["status"] == "CANCELLED"
        owner = (await api.get(f"/async-jobs/{job_id}", headers=user_headers(external))).json()
        assert owner["status"] == "CANCELLED"
    # a running GitHub commit may have made its PUT: it is left to complete
    response = await api.post(f"/admin/api/jobs/{commit}/cancel", headers=OP)
    assert_problem(response, 409, "NOT_CANCELLABLE")
    for job_id in (pending, completed):
        response = await api.post(f"/admin/api/jobs/{job_id}/cancel", headers=OP)
        assert_problem(response, 409, "CONFLICT")


async def test_bulk_with_a_thousand_jobs_previews_and_reports_the_count(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    user_id, external = await new_user(sessions)
    await insert_jobs(sessions, user_id, 1000)
    await insert_jobs(sessions, user_id, 1000, status="PENDING", job_type="SCRAP_REFINE")
    body = {"action": "retry", "filter": {"user": external}}
    preview = await api.post("/admin/api/jobs/bulk/preview", json=body, headers=OP)
    assert preview.json()["count"] == 1000
    result = (await api.post("/admin/api/jobs/bulk", json=body, headers=OP)).json()
    assert result["count"] == 1000 and result["matched"] == 1000
    cancel = {"action": "cancel", "filter": {"user": external, "type": ["SCRAP_REFINE"]}}
    result = (await api.post("/admin/api/jobs/bulk", json=cancel, headers=OP)).json()
    assert result["count"] == 1000
    async with sessions() as session:
        counts = dict(
            (
                await session.execute(
                    select(AsyncJob.status, func.count())
                    .where(AsyncJob.user_id == user_id)
                    .group_by(AsyncJob.status)
                )
            ).all()
        )
    assert counts == {"PENDING": 1000, "CANCELLED": 1000}


async def test_bulk_refuses_more_than_the_limit_and_bad_actions(
    api: httpx.AsyncClient, sessions: Sessions, settings_for: Callable[..., ApiSettings]
) -> None:
    user_id, external = await new_user(sessions)
    await insert_jobs(sessions, user_id, 3)
    settings = settings_for(admin_bulk_limit=2)
    async with api_with(settings) as small:
        body = {"action": "retry", "filter": {"user": external}}
        response = await small.post("/admin/api/jobs/bulk", json=body, headers=OP)
        assert_problem(response, 400, "VALIDATION_ERROR")
        assert "bulk limit" in response.json()["detail"]
    bad = {"action": "delete", "filter": {}}
    assert_problem(
        await api.post("/admin/api/jobs/bulk", json=bad, headers=OP), 400, "VALIDATION_ERROR"
    )
