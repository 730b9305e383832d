"""`POST /til/{summaryId}/github-commits`: the six checks of docs/reference/job-rules.md §3.3 in
order, each with its own code; file paths that avoid existing files; row + job + outbox in one
transaction."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

from sqlalchemy import func, select, update

from san_common.models import AsyncJob, DailySummary, OutboxMessage, TilGithubCommit
from tests.api.support import assert_problem
from tests.github.conftest import api_client, github_api_settings
from tests.github.support import DAY, Person, World


async def footprint(world: World, person: Person) -> tuple[int, int, int]:
    """(commit rows, jobs, outbox rows) of this person."""
    user_id = await world.user_id(person)
    async with world.sessions() as session:
        commits = await session.scalar(
            select(func.count())
            .select_from(TilGithubCommit)
            .where(TilGithubCommit.user_id == user_id)
        )
        jobs = await session.scalar(
            select(func.count()).select_from(AsyncJob).where(AsyncJob.user_id == user_id)
        )
        outbox = await session.scalar(
            select(func.count())
            .select_from(OutboxMessage)
            .where(OutboxMessage.body["user_id"].astext == str(user_id))
        )
    return commits or 0, jobs or 0, outbox or 0


async def test_each_check_in_order_has_its_own_code_and_writes_nothing(world: World) -> None:
    ann = world.person()
    await world.api.get("/me/github/repositories", headers=ann.headers)  # provisions the user
    pending = await world.til(ann, status="PENDING")

    # everything is wrong: the first check speaks
    assert_problem(await world.commit(ann, pending), 400, "TIL_NOT_COMPLETED")
    failed = await world.til(ann, day=DAY.replace(day=1), status="FAILED")
    assert_problem(await world.commit(ann, failed), 400, "TIL_NOT_COMPLETED")

    done = await world.til(ann, day=DAY.replace(day=3))
    assert_problem(await world.commit(ann, done), 400, "GITHUB_NOT_LINKED")

    await world.link(ann)
    assert_problem(await world.commit(ann, done), 400, "REPOSITORY_NOT_CONNECTED")

    for name in ("til", "notes"):
        world.github.add_repo(ann.login, name)
        await world.connect(ann, name)
    assert_problem(await world.commit(ann, done), 400, "MULTIPLE_REPOSITORIES")
    assert await footprint(world, ann) == (0, 0, 0)

    repos = (await world.api.get("/me/github/repositories", headers=ann.headers)).json()
    notes = next(r for r in repos["repositories"] if r["name"] == "notes")
    await world.api.delete(f"/me/github/repositories/{notes['repositoryId']}", headers=ann.headers)
    accepted = await world.commit(ann, done)
    assert accepted.status_code == 202, accepted.text
    assert await footprint(world, ann) == (1, 1, 1)

    # the same content again, while PENDING, PROCESSING or COMPLETED: 409
    commit_id = accepted.json()["commitId"]
    for status in ("PENDING", "PROCESSING", "COMPLETED"):
        await set_commit_status(world, commit_id, status)
        assert_problem(await world.commit(ann, done), 409, "DUPLICATE_RESOURCE")
    assert await footprint(world, ann) == (1, 1, 1)

    # a FAILED commit does not block a new try
    await set_commit_status(world, commit_id, "FAILED")
    again = await world.commit(ann, done)
    assert again.status_code == 202, again.text
    assert again.json()["commitId"] != commit_id


async def set_commit_status(world: World, commit_id: str, status: str) -> None:
    async with world.sessions() as session, session.begin():
        await session.execute(
            update(TilGithubCommit)
            .where(TilGithubCommit.id == uuid.UUID(commit_id))
            .values(status=status)
        )


async def test_accepted_commit_writes_row_job_and_outbox_together(world: World) -> None:
    ben = await world.ready()
    markdown = f"# TIL\n\nAll about {uuid.uuid4().hex}\n"
    summary = await world.til(ben, markdown=markdown)
    response = await world.commit(ben, summary)
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["targetId"] == body["commitId"]
    assert body["filePath"] == f"TIL/{DAY.isoformat()}.md"

    row = await world.commit_row(body["commitId"])
    assert (row.status, row.content, row.file_path, row.repo_owner, row.repo_name) == (
        "PENDING",
        markdown,
        body["filePath"],
        ben.login,
        "til",
    )
    assert row.content_hash == hashlib.sha256(markdown.encode()).hexdigest()
    job = await world.job(body["jobId"])
    assert (job.job_type, job.status, job.target_id) == ("TIL_GITHUB_COMMIT", "PENDING", row.id)

    listed = await world.api.get(f"/til/{summary}/github-commits", headers=ben.headers)
    assert listed.status_code == 200
    [view] = listed.json()["commits"]
    assert (view["commitId"], view["jobId"], view["status"], view["repository"]) == (
        body["commitId"],
        body["jobId"],
        "PENDING",
        f"{ben.login}/til",
    )
    assert view["commitSha"] is None and view["commitUrl"] is None

    other = world.person()
    assert_problem(await world.commit(other, summary), 404, "NOT_FOUND")
    assert_problem(
        await world.api.get(f"/til/{summary}/github-commits", headers=other.headers),
        404,
        "NOT_FOUND",
    )
    assert_problem(await world.commit(ben, uuid.uuid4()), 404, "NOT_FOUND")


async def test_existing_files_on_github_push_the_path_to_a_suffix(world: World) -> None:
    cy = await world.ready()
    for taken in (f"TIL/{DAY}.md", f"TIL/{DAY}-1.md"):
        world.github.commit_file(cy.login, "til", taken, b"someone else's notes\n")
    response = await world.commit(cy, await world.til(cy))
    assert response.status_code == 202, response.text
    assert response.json()["filePath"] == f"TIL/{DAY}-2.md"
    asked = [r.path.split("/contents/")[1] for r in world.github.requests if "/contents/" in r.path]
    assert asked == [f"TIL/{DAY}.md", f"TIL/{DAY}-1.md", f"TIL/{DAY}-2.md"]


async def test_a_pending_commit_reserves_its_path(world: World) -> None:
    dee = await world.ready()
    summary = await world.til(dee)
    first = await world.commit(dee, summary)
    assert first.json()["filePath"] == f"TIL/{DAY}.md"
    # The day's TIL is rewritten (new content) before the first commit ran: GitHub has no
    # file there yet, but the PENDING commit holds the path.
    async with world.sessions() as session, session.begin():
        await session.execute(
            update(DailySummary)
            .where(DailySummary.id == summary)
            .values(til_markdown=f"# rewritten {uuid.uuid4().hex}\n")
        )
    second = await world.commit(dee, summary)
    assert second.status_code == 202, second.text
    assert second.json()["filePath"] == f"TIL/{DAY}-1.md"


async def test_folder_and_branch_of_the_repository_are_used(world: World) -> None:
    eve = await world.ready(directory="notes/daily", branch="pub")
    world.github.commit_file(eve.login, "til", f"notes/daily/{DAY}.md", b"on main only\n")
    response = await world.commit(eve, await world.til(eve))
    assert response.status_code == 202, response.text
    assert response.json()["filePath"] == f"notes/daily/{DAY}.md"  # free on branch `pub`
    [asked] = [r for r in world.github.requests if "/contents/" in r.path]
    assert asked.query == {"ref": "pub"}


async def test_no_free_path_left_is_409(world: World, db_url: str, amqp_url: str) -> None:
    fay = await world.ready()
    for taken in (f"TIL/{DAY}.md", f"TIL/{DAY}-1.md"):
        world.github.commit_file(fay.login, "til", taken, b"taken\n")
    settings = github_api_settings(db_url, amqp_url, world.github, til_commit_max_path_suffix=1)
    async with api_client(settings) as api:
        summary = await world.til(fay)
        response = await api.post(f"/til/{summary}/github-commits", headers=fay.headers)
    assert_problem(response, 409, "FILE_PATH_UNAVAILABLE")
    assert (await footprint(world, fay))[0] == 0


async def test_github_trouble_during_the_path_check_writes_nothing(world: World) -> None:
    gus = await world.ready()
    summary = await world.til(gus)
    world.github.add_fault("http_500", token=gus.token)
    assert_problem(await world.commit(gus, summary), 503, "GITHUB_UNAVAILABLE")
    world.github.revoke(gus.token)
    response = await world.commit(gus, summary)
    body = assert_problem(response, 400, "GITHUB_TOKEN_REJECTED")
    assert "relink GitHub" in body["detail"]
    assert await footprint(world, gus) == (0, 0, 0)


async def test_concurrent_identical_requests_register_one_commit(world: World) -> None:
    hal = await world.ready()
    summary = await world.til(hal)
    responses = await asyncio.gather(*(world.commit(hal, summary) for _ in range(4)))
    codes = sorted(r.status_code for r in responses)
    assert codes == [202, 409, 409, 409], [r.text for r in responses]
    assert await footprint(world, hal) == (1, 1, 1)
