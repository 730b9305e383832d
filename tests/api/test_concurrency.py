"""POST /scraps under concurrency (docs/reference/job-rules.md §2.2, §3.1): many identical requests
at once yield one scrap and at most one active job of each type; dedup is per user."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import func, select

from san_api.app import create_app
from san_api.settings import ApiSettings
from san_common.jobs import lifecycle
from san_common.models import OutboxMessage, Scrap, User
from tests.api.support import (
    Sessions,
    embedding_at,
    footprint,
    insert_card,
    jobs_of_target,
    over_http,
    save_scrap,
    subject_of,
    user_id_of,
)

CONCURRENCY = 50


async def _post_many(
    client: httpx.AsyncClient, headers: dict[str, str], content: str
) -> list[httpx.Response]:
    return list(
        await asyncio.gather(
            *(
                client.post("/scraps", json={"content": content}, headers=headers)
                for _ in range(CONCURRENCY)
            )
        )
    )


async def _assert_one_scrap_and_one_job_per_type(
    sessions: Sessions, headers: dict[str, str], responses: list[httpx.Response]
) -> None:
    statuses = Counter(response.status_code for response in responses)
    assert statuses == {202: CONCURRENCY}, [r.text for r in responses if r.status_code != 202]
    bodies: list[dict[str, Any]] = [response.json() for response in responses]
    scrap_ids = {body["scrapId"] for body in bodies}
    assert len(scrap_ids) == 1
    scrap_id = uuid.UUID(scrap_ids.pop())

    subject = subject_of(headers)
    async with sessions() as session:
        users = await session.scalar(
            select(func.count()).select_from(User).where(User.external_id == subject)
        )
        scraps = list(
            await session.scalars(
                select(Scrap.id).where(Scrap.user_id == await user_id_of(sessions, subject))
            )
        )
    assert users == 1
    assert scraps == [scrap_id]

    jobs = await jobs_of_target(sessions, scrap_id)
    active = Counter(job.job_type for job in jobs if job.status in ("PENDING", "PROCESSING"))
    assert active == {"CARD_ANALYSIS": 1, "SCRAP_REFINE": 1}
    assert len(jobs) == 2  # nothing FAILED or COMPLETED could have re-registered one

    # the job ids handed out are exactly the registered ones: the analysis to every
    # response (a duplicate polls the one on its way), the refine to the first only
    analysis_ids = [b["analysisJobId"] for b in bodies]
    refine_ids = [b["refineJobId"] for b in bodies if b["refineJobId"] is not None]
    by_type = {job.job_type: str(job.job_id) for job in jobs}
    assert analysis_ids == [by_type["CARD_ANALYSIS"]] * len(bodies)
    assert refine_ids == [by_type["SCRAP_REFINE"]]
    assert sum(not b["duplicate"] for b in bodies) == 1

    # one outbox message per job, never one per request
    async with sessions() as session:
        outbox = await session.scalar(
            select(func.count())
            .select_from(OutboxMessage)
            .where(OutboxMessage.body["target_id"].astext == str(scrap_id))
        )
    assert outbox == 2


async def test_concurrent_identical_posts_in_process(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    """A brand-new user: provisioning and the scrap insert race at the same time."""
    headers = new_user()
    responses = await _post_many(api, headers, f"same text {uuid.uuid4()}\r\n")
    await _assert_one_scrap_and_one_job_per_type(sessions, headers, responses)


async def test_concurrent_identical_posts_of_a_known_user_in_process(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    """An existing user: only the scrap insert and the job registration race."""
    headers = new_user()
    await save_scrap(api, headers)
    before = await footprint(sessions, subject_of(headers))
    content = f"same text {uuid.uuid4()}"
    # every spelling normalizes to the same content, so to the same dedup key
    spellings = [f"  {content}\r\n", f"\n{content}", f"{content}\t", content]
    responses = list(
        await asyncio.gather(
            *(
                api.post("/scraps", json={"content": spellings[i % 4]}, headers=headers)
                for i in range(CONCURRENCY)
            )
        )
    )
    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["scrapId"] for r in responses}) == 1
    after = await footprint(sessions, subject_of(headers))
    assert (after.scraps, after.jobs, after.outbox) == (
        before.scraps + 1,
        before.jobs + 2,
        before.outbox + 2,
    )


async def test_concurrent_identical_posts_over_real_http(
    settings_for: Callable[..., ApiSettings],
    sessions: Sessions,
    new_user: Callable[[], dict[str, str]],
) -> None:
    """uvicorn on a loopback port: 50 connections, a DB pool smaller than the crowd."""
    headers = new_user()
    app = create_app(settings_for())
    async with (
        over_http(app) as base_url,
        httpx.AsyncClient(
            base_url=base_url,
            limits=httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=0),
            timeout=60,
        ) as client,
    ):
        responses = await _post_many(client, headers, f"over http {uuid.uuid4()}")
        await _assert_one_scrap_and_one_job_per_type(sessions, headers, responses)

        # a client that got 202 can poll its job at once, on another connection
        body = next(r.json() for r in responses if r.json()["analysisJobId"])
        polled = await client.get(f"/async-jobs/{body['analysisJobId']}", headers=headers)
        assert polled.status_code == 200, polled.text
        assert polled.json()["status"] == "PENDING"


async def test_same_content_from_two_users_is_two_scraps(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    alice, bob = new_user(), new_user()
    content = f"shared article {uuid.uuid4()}"
    first, second = await asyncio.gather(
        save_scrap(api, alice, content), save_scrap(api, bob, content)
    )
    assert first["scrapId"] != second["scrapId"]
    for saved in (first, second):
        assert saved["duplicate"] is False
        assert saved["analysisJobId"] and saved["refineJobId"]
        types = sorted(job.job_type for job in await jobs_of_target(sessions, saved["scrapId"]))
        assert types == ["CARD_ANALYSIS", "SCRAP_REFINE"]


async def test_repost_while_analysis_is_pending_registers_nothing_and_names_the_running_one(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    """The client polls the analysis already on its way, as it would have for the first
    post (`make demo` run again while its first scrap's jobs are still running)."""
    headers = new_user()
    content = f"pending {uuid.uuid4()}"
    first = await save_scrap(api, headers, content)
    again = await save_scrap(api, headers, content)
    assert again == {
        "scrapId": first["scrapId"],
        "analysisJobId": first["analysisJobId"],
        "refineJobId": None,
        "duplicate": True,
    }
    assert len(await jobs_of_target(sessions, first["scrapId"])) == 2


async def _finish_analysis(sessions: Sessions, job_id: str, status: str) -> None:
    """What the ai-worker would do to the job (no worker runs in this suite): claim it,
    then complete or fail that try, through the lifecycle like a worker."""
    async with sessions() as session, session.begin():
        job = await lifecycle.claim(session, uuid.UUID(job_id), "test-worker", timedelta(minutes=1))
        assert job is not None
        if status == "COMPLETED":
            assert await lifecycle.complete(session, job.job_id, job.tries)
        else:
            assert await lifecycle.fail(session, job.job_id, job.tries, "boom", "failed")


async def test_repost_after_the_card_exists_registers_no_job(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    content = f"analysed {uuid.uuid4()}"
    first = await save_scrap(api, headers, content)
    await _finish_analysis(sessions, first["analysisJobId"], "COMPLETED")
    user_id = await user_id_of(sessions, subject_of(headers))
    await insert_card(sessions, user_id, embedding_at(0.2, 3), scrap_id=uuid.UUID(first["scrapId"]))
    before = await footprint(sessions, subject_of(headers))

    again = await save_scrap(api, headers, f"\r\n {content} \r\n")

    assert again["scrapId"] == first["scrapId"]
    assert again["duplicate"] is True
    assert again["analysisJobId"] is None
    assert again["refineJobId"] is None
    assert await footprint(sessions, subject_of(headers)) == before


async def test_repost_after_a_failed_analysis_without_card_registers_a_new_one(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    """The counterpart of the test above: it is the card, not the old job, that stops it."""
    headers = new_user()
    content = f"failed {uuid.uuid4()}"
    first = await save_scrap(api, headers, content)
    await _finish_analysis(sessions, first["analysisJobId"], "FAILED")

    again = await save_scrap(api, headers, content)

    assert again["scrapId"] == first["scrapId"]
    assert again["analysisJobId"] not in (None, first["analysisJobId"])
    assert again["refineJobId"] is None
    jobs = await jobs_of_target(sessions, first["scrapId"])
    analyses = sorted(
        (job.status, str(job.job_id)) for job in jobs if job.job_type == "CARD_ANALYSIS"
    )
    assert analyses == sorted(
        [("FAILED", first["analysisJobId"]), ("PENDING", again["analysisJobId"])]
    )
