"""TIL_GITHUB_COMMIT end to end in one process: API → outbox → relay → RabbitMQ →
github-worker → fake GitHub, with the faults GitHub really has."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from san_common.github import RELINK_MESSAGE
from tests.github.support import DAY, Person, World
from tests.waiting import settled_job

pytestmark = pytest.mark.rabbit

PATH = f"TIL/{DAY.isoformat()}.md"


async def request(world: World, person: Person, **til: Any) -> dict[str, Any]:
    response = await world.commit(person, await world.til(person, **til))
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_til_lands_in_the_repository_and_both_rows_complete(worker_world: World) -> None:
    world = worker_world
    ada = await world.ready()
    markdown = "# TIL 2026-12-02\n\n## Ownership\n\nRust moves values; borrows are checked.\n"
    summary = await world.til(ada, markdown=markdown)
    accepted = (await world.commit(ada, summary)).json()

    job = await settled_job(world.sessions, accepted["jobId"])
    assert job.status == "COMPLETED", job.error_message
    assert world.github.file(ada.login, "til", PATH) == markdown.encode()
    [commit] = world.github.commits_for(ada.login, "til", PATH)
    assert commit.message == f"Add TIL {DAY.isoformat()}"
    row = await world.commit_row(accepted["commitId"])
    assert (row.status, row.commit_sha, row.commit_url, row.error_message) == (
        "COMPLETED",
        commit.sha,
        commit.html_url,
        None,
    )

    listed = (await world.api.get(f"/til/{summary}/github-commits", headers=ada.headers)).json()
    [view] = listed["commits"]
    assert (view["status"], view["commitSha"], view["commitUrl"]) == (
        "COMPLETED",
        commit.sha,
        commit.html_url,
    )
    polled = (await world.api.get(f"/async-jobs/{accepted['jobId']}", headers=ada.headers)).json()
    assert polled["status"] == "COMPLETED"


async def test_a_lost_put_answer_is_retried_without_a_second_commit(worker_world: World) -> None:
    world = worker_world
    bo = await world.ready()
    world.github.add_fault("drop_response", method="PUT", token=bo.token)
    accepted = await request(world, bo)

    job = await settled_job(world.sessions, accepted["jobId"])
    assert job.status == "COMPLETED", job.error_message
    commits = world.github.commits_for(bo.login, "til", PATH)
    assert len(commits) == 1  # the retry found its own content there and did not commit again
    puts = [r for r in world.github.requests_with(bo.token) if r.method == "PUT"]
    assert [p.status for p in puts] == [None]  # one PUT, whose answer never arrived
    row = await world.commit_row(accepted["commitId"])
    assert (row.status, row.commit_sha, row.commit_url) == (
        "COMPLETED",
        commits[0].sha,
        commits[0].html_url,
    )


async def test_rate_limits_are_waited_out_exactly_and_do_not_spend_the_try_budget(
    worker_world: World,
) -> None:
    world = worker_world
    kinds = ("http_429", "http_403_retry_after", "reset", "many")
    people = {kind: await world.ready() for kind in kinds}
    for kind in ("http_429", "http_403_retry_after"):
        world.github.add_fault(kind, method="PUT", token=people[kind].token, retry_after="2")
    world.github.add_fault("http_403_reset", method="PUT", token=people["reset"].token, reset_in=2)
    # more rate-limited answers in a row than the worker has tries (3): waits are not failures
    world.github.add_fault(
        "http_429", times=4, method="PUT", token=people["many"].token, retry_after="0.2"
    )
    accepted = [await request(world, people[kind]) for kind in kinds]

    jobs = await asyncio.gather(*(settled_job(world.sessions, a["jobId"]) for a in accepted))
    assert [j.status for j in jobs] == ["COMPLETED"] * 4, [j.error_message for j in jobs]
    for kind in kinds:
        assert len(world.github.commits_for(people[kind].login, "til", PATH)) == 1
        paced = [
            r for r in world.github.requests_with(people[kind].token) if r.status in (403, 429)
        ]
        assert len(paced) == (4 if kind == "many" else 1)
    for kind in ("http_429", "http_403_retry_after"):
        requests = world.github.requests_with(people[kind].token)
        [limited] = [r for r in requests if r.status in (403, 429)]
        later = [r for r in requests if r.at > limited.at]
        # the worker came back (GET, then PUT), and nothing landed inside the 2 s window
        assert [r.method for r in later] == ["GET", "PUT"]
        assert min(r.at for r in later) - limited.at >= 2.0
    requests = world.github.requests_with(people["reset"].token)
    [limited] = [r for r in requests if r.status == 403]
    later = [r for r in requests if r.at > limited.at]
    assert later and min(r.wall for r in later) >= int(limited.wall + 2)  # x-ratelimit-reset


async def test_a_revoked_token_fails_at_once_with_the_relink_message(worker_world: World) -> None:
    world = worker_world
    cy = await world.ready()
    summary = await world.til(cy)
    world.github.revoke(cy.token)
    before = len(world.github.requests_with(cy.token))
    commit_id, job_id = await world.register_directly(cy, summary, PATH)

    job = await settled_job(world.sessions, job_id)
    assert job.status == "FAILED"
    assert job.error_message is not None and RELINK_MESSAGE in job.error_message
    assert "gave up" not in job.error_message
    row = await world.commit_row(commit_id)
    # the row its owner reads: the sanitized summary, which still says what to do
    assert row.status == "FAILED" and row.error_message == job.error_summary
    assert RELINK_MESSAGE in (row.error_message or ""), row.error_message
    assert len(world.github.requests_with(cy.token)) - before == 1  # asked once: no retries


async def test_other_4xx_fail_without_retries(worker_world: World) -> None:
    world = worker_world
    ed = await world.ready()
    world.github.add_repo(ed.login, "til", pushers=set())  # push permission taken away
    accepted = await request(world, ed)
    job = await settled_job(world.sessions, accepted["jobId"])
    assert job.status == "FAILED"
    assert job.error_message is not None and "403" in job.error_message
    puts = [r for r in world.github.requests_with(ed.token) if r.method == "PUT"]
    assert len(puts) == 1
    assert (await world.commit_row(accepted["commitId"])).status == "FAILED"


async def test_server_errors_are_retried_a_bounded_number_of_times(worker_world: World) -> None:
    world = worker_world
    fe = await world.ready()
    summary = await world.til(fe)
    world.github.add_fault("http_500", times=None, token=fe.token)
    commit_id, job_id = await world.register_directly(fe, summary, PATH)

    job = await settled_job(world.sessions, job_id)
    assert job.status == "FAILED"
    assert job.error_message is not None and "gave up after 3 tries" in job.error_message
    assert len([r for r in world.github.requests_with(fe.token) if r.status == 500]) == 3
    assert (await world.commit_row(commit_id)).status == "FAILED"


async def test_someone_elses_file_at_the_chosen_path_is_never_overwritten(
    worker_world: World,
) -> None:
    world = worker_world
    gil = await world.ready()
    summary = await world.til(gil)
    # the path was free when the commit was registered; then someone wrote it
    world.github.commit_file(gil.login, "til", PATH, b"someone else's notes\n")
    commit_id, job_id = await world.register_directly(gil, summary, PATH)

    job = await settled_job(world.sessions, job_id)
    assert job.status == "FAILED"
    assert job.error_message is not None and "other content" in job.error_message
    assert world.github.file(gil.login, "til", PATH) == b"someone else's notes\n"
    assert not [r for r in world.github.requests_with(gil.token) if r.method == "PUT"]
    assert (await world.commit_row(commit_id)).status == "FAILED"


async def test_one_mutation_at_a_time_per_user_while_users_run_in_parallel(
    worker_world: World,
) -> None:
    world = worker_world
    world.github.put_delay_seconds = 0.4
    ivy, jo = await world.ready(), await world.ready()
    accepted = [
        await request(world, ivy, day=DAY),
        await request(world, ivy, day=DAY.replace(day=3)),
        await request(world, ivy, day=DAY.replace(day=4)),
        await request(world, jo, day=DAY),
    ]
    jobs = await asyncio.gather(*(settled_job(world.sessions, a["jobId"]) for a in accepted))
    assert [j.status for j in jobs] == ["COMPLETED"] * 4, [j.error_message for j in jobs]
    assert world.github.max_concurrent_mutations(ivy.token) == 1
    assert world.github.max_concurrent_mutations() >= 2  # other users were not held back
