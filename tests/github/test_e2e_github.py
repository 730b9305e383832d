"""End to end with the services as separate OS processes: the API, the relay and the
github-worker (its own process, queue and pool) against the fake GitHub; the keys come from
the shared data directory, as in a local run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select

from san_common.db.engine import create_engine, create_session_factory
from san_common.models import DailySummary, TilGithubCommit, User
from tests.e2e.conftest import Stack
from tests.fakes.fake_github import FakeGithub
from tests.github.support import DAY
from tests.waiting import settled_job_via_api

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]


@pytest.fixture
def stack_env(stack_env: dict[str, str], fake_github: FakeGithub) -> Iterator[dict[str, str]]:
    yield {
        **stack_env,
        "GITHUB_API_URL": fake_github.api_url,
        "GITHUB_OAUTH_URL": fake_github.oauth_url,
        "GITHUB_CLIENT_ID": fake_github.client_id,
        "GITHUB_CLIENT_SECRET": fake_github.client_secret,
        "LOG_LEVEL": "DEBUG",  # the strictest check: even debug lines carry no token
    }


async def test_til_commit_through_the_github_worker_process(
    stack: Stack, fake_github: FakeGithub, fresh_db_url: str
) -> None:
    worker = stack.start("github-worker")
    stack.start("relay")
    login = f"e2e-{uuid.uuid4().hex[:8]}"
    token = fake_github.add_user(login)
    fake_github.add_repo(login, "til")
    # the first PUT is applied, but its answer is lost on the way back
    fake_github.add_fault("drop_response", method="PUT", token=token)
    headers = stack.headers(f"e2e-{login}")
    engine = create_engine(fresh_db_url, pool_size=2)
    sessions = create_session_factory(engine)
    try:
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as api:
            linked = await api.put("/me/github", json={"accessToken": token}, headers=headers)
            assert linked.status_code == 200, linked.text
            connected = await api.post(
                "/me/github/repositories", json={"owner": login, "name": "til"}, headers=headers
            )
            assert connected.status_code == 201, connected.text
            markdown = f"# TIL {DAY}\n\nProcesses, queues and pools {uuid.uuid4().hex}.\n"
            async with sessions() as session, session.begin():
                user_id = await session.scalar(
                    select(User.id).where(User.external_id == f"e2e-{login}")
                )
                assert user_id is not None
                summary = DailySummary(
                    user_id=user_id,
                    target_date=DAY,
                    status="COMPLETED",
                    title="TIL",
                    til_markdown=markdown,
                )
                session.add(summary)
            accepted = await api.post(f"/til/{summary.id}/github-commits", headers=headers)
            assert accepted.status_code == 202, accepted.text
            body = accepted.json()

            job = await settled_job_via_api(api, headers, body["jobId"], context=stack.logs)
            assert job["status"] == "COMPLETED", (job, stack.logs())
            path = body["filePath"]
            assert fake_github.file(login, "til", path) == markdown.encode()
            [commit] = fake_github.commits_for(login, "til", path)  # exactly one, despite the retry
            listed = (await api.get(f"/til/{summary.id}/github-commits", headers=headers)).json()
            [view] = listed["commits"]
            assert (view["status"], view["commitSha"], view["commitUrl"]) == (
                "COMPLETED",
                commit.sha,
                commit.html_url,
            )
        async with sessions() as session:
            row = await session.get(TilGithubCommit, uuid.UUID(body["commitId"]))
        assert row is not None and row.status == "COMPLETED"
    finally:
        await engine.dispose()

    assert worker.terminate() == 0
    assert "til_github_commit" in worker.log()  # it consumed its own queue …
    assert "card_analysis" not in worker.log()  # … and only that one
    assert "job retry" in worker.log()  # the lost answer was retried
    for process in stack.processes:
        assert token not in process.log(), f"the token reached the {process.name} log"
