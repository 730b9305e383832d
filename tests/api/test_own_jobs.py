"""`GET /async-jobs`: the caller's own jobs and nobody else's, filtered by status and type,
newest first, in pages joined by an opaque cursor that neither skips nor repeats a job."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
from sqlalchemy import update

from san_common.models import AsyncJob
from tests.api.support import Sessions, assert_problem, save_scrap


async def _list(api: httpx.AsyncClient, headers: dict[str, str], **params: object) -> dict:
    response = await api.get("/async-jobs", params=params, headers=headers)
    assert response.status_code == 200, response.text
    body: dict = response.json()
    return body


async def test_a_user_lists_their_own_jobs_and_never_anothers(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    alice, bob = new_user(), new_user()
    mine = await save_scrap(api, alice)
    theirs = await save_scrap(api, bob)

    listed = {job["jobId"] for job in (await _list(api, alice))["items"]}
    assert listed == {mine["analysisJobId"], mine["refineJobId"]}
    assert not listed & {theirs["analysisJobId"], theirs["refineJobId"]}
    other = {job["jobId"] for job in (await _list(api, bob))["items"]}
    assert other == {theirs["analysisJobId"], theirs["refineJobId"]}


async def test_jobs_are_filtered_by_type_and_by_status(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    alice = new_user()
    first, second = await save_scrap(api, alice), await save_scrap(api, alice)
    async with sessions() as session, session.begin():
        await session.execute(
            update(AsyncJob)
            .where(AsyncJob.job_id == uuid.UUID(first["analysisJobId"]))
            .values(status="FAILED")
        )

    analyses = (await _list(api, alice, jobType="CARD_ANALYSIS"))["items"]
    assert {job["jobId"] for job in analyses} == {first["analysisJobId"], second["analysisJobId"]}
    assert all(job["jobType"] == "CARD_ANALYSIS" for job in analyses)

    failed = (await _list(api, alice, status="FAILED"))["items"]
    assert [job["jobId"] for job in failed] == [first["analysisJobId"]]
    pending_analyses = await _list(api, alice, status="PENDING", jobType="CARD_ANALYSIS")
    assert [job["jobId"] for job in pending_analyses["items"]] == [second["analysisJobId"]]
    both = await _list(api, alice, status=["PENDING", "FAILED"], jobType="SCRAP_REFINE")
    assert {job["jobId"] for job in both["items"]} == {first["refineJobId"], second["refineJobId"]}
    assert (await _list(api, alice, jobType="TIL_GENERATION"))["items"] == []


async def test_pages_join_without_gaps_or_repeats_newest_first(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    alice = new_user()
    for _ in range(4):
        await save_scrap(api, alice)  # 8 jobs
    everything = (await _list(api, alice, limit=100))["items"]
    assert len(everything) == 8
    keys = [(job["createdAt"], job["jobId"]) for job in everything]
    assert keys == sorted(keys, reverse=True), "newest first"

    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, object] = {"limit": 3}
        if cursor is not None:
            params["cursor"] = cursor
        page = await _list(api, alice, **params)
        assert len(page["items"]) <= 3
        seen += [job["jobId"] for job in page["items"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
        await save_scrap(api, alice)  # new jobs while paging never shift the pages
    assert seen == [job["jobId"] for job in everything]


async def test_a_bad_filter_or_cursor_is_a_400_problem(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    alice = new_user()
    for params in (
        {"status": "DONE"},
        {"jobType": "card analysis"},
        {"limit": 0},
        {"cursor": "not-a-cursor"},
        {"cursor": "MjAyNi0xMi0wNnxub3QtYS11dWlk"},  # base64 of "2026-12-06|not-a-uuid"
    ):
        response = await api.get("/async-jobs", params=params, headers=alice)
        assert_problem(response, 400, "VALIDATION_ERROR")


async def test_a_user_cancels_their_own_pending_job_and_only_theirs(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    alice, bob = new_user(), new_user()
    saved = await save_scrap(api, alice)
    job_id = saved["analysisJobId"]

    assert_problem(await api.delete(f"/async-jobs/{job_id}", headers=bob), 404, "NOT_FOUND")
    still = await api.get(f"/async-jobs/{job_id}", headers=alice)
    assert still.json()["status"] == "PENDING", "another user's cancel changed nothing"
    unknown = await api.delete(f"/async-jobs/{uuid.uuid4()}", headers=alice)
    assert_problem(unknown, 404, "NOT_FOUND")

    cancelled = await api.delete(f"/async-jobs/{job_id}", headers=alice)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "CANCELLED"
    assert (await api.get(f"/async-jobs/{job_id}", headers=alice)).json()["status"] == "CANCELLED"
    listed = await _list(api, alice, status="CANCELLED")
    assert [job["jobId"] for job in listed["items"]] == [job_id]
    sibling = await api.get(f"/async-jobs/{saved['refineJobId']}", headers=alice)
    assert sibling.json()["status"] == "PENDING", "only the job asked for"


async def test_cancelling_a_job_that_is_not_pending_is_a_409_problem(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    alice = new_user()
    saved = await save_scrap(api, alice)
    job_id = saved["analysisJobId"]
    assert (await api.delete(f"/async-jobs/{job_id}", headers=alice)).status_code == 200
    again = assert_problem(
        await api.delete(f"/async-jobs/{job_id}", headers=alice), 409, "CONFLICT"
    )
    assert "CANCELLED" in again["detail"]

    failed_id = saved["refineJobId"]
    async with sessions() as session, session.begin():
        await session.execute(
            update(AsyncJob).where(AsyncJob.job_id == uuid.UUID(failed_id)).values(status="FAILED")
        )
    refused = await api.delete(f"/async-jobs/{failed_id}", headers=alice)
    assert "FAILED" in assert_problem(refused, 409, "CONFLICT")["detail"]
    assert (await api.get(f"/async-jobs/{failed_id}", headers=alice)).json()["status"] == "FAILED"
