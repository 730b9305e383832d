"""GITHUB_STAR_RECOMMENDATION: every star read (Link pagination), recommendations from what
the user is learning (the offline `local` AI provider), stored, listed, per user."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from san_common.github import RELINK_MESSAGE
from san_common.models import GithubStarRecommendation
from tests.api.support import assert_problem
from tests.github.support import Person, World
from tests.waiting import settled_job


def stars(count: int, specials: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    listed = []
    for i in range(count):
        star = {
            "full_name": f"misc/repo{i}",
            "description": "Recipes and knitting patterns",
            "topics": ["cooking"],
            "language": None,
            "html_url": f"https://github.com/misc/repo{i}",
        }
        star.update(specials.get(i, {}))
        listed.append(star)
    return listed


async def recommend(world: World, person: Person) -> dict[str, Any]:
    accepted = await world.api.post("/github-star-recommendations", headers=person.headers)
    assert accepted.status_code == 202, accepted.text
    body: dict[str, Any] = accepted.json()
    assert body["targetId"] == str(await world.user_id(person))
    return body


async def test_250_stars_over_3_pages_become_recommendations_of_that_user_only(
    worker_world: World,
) -> None:
    world = worker_world
    amy = world.person()
    await world.link(amy)
    await world.card(amy, "database", ["postgresql", "indexing"])
    world.github.set_stars(
        amy.login,
        stars(
            250,
            {
                3: {
                    "full_name": "tools/pg-tuner",
                    "topics": ["postgresql"],
                    "html_url": "https://github.com/tools/pg-tuner",
                },
                249: {
                    "full_name": "tools/index-advisor",
                    "topics": ["database"],
                    "description": "Indexing advice for PostgreSQL",
                    "html_url": "https://github.com/tools/index-advisor",
                },
            },
        ),
    )
    job_id = (await recommend(world, amy))["jobId"]
    job = await settled_job(world.sessions, job_id)
    assert job.status == "COMPLETED", job.error_message

    pages = [
        r.query.get("page", "1")
        for r in world.github.requests_with(amy.token)
        if r.path.endswith("/user/starred")
    ]
    assert pages == ["1", "2", "3"]
    listed = (await world.api.get("/github-star-recommendations", headers=amy.headers)).json()
    assert listed["jobId"] == job_id and listed["generatedAt"]
    recs = listed["recommendations"]
    # the star on page 3 matches best (all three interests), then the one on page 1
    assert [r["repoFullName"] for r in recs] == ["tools/index-advisor", "tools/pg-tuner"]
    assert [r["rank"] for r in recs] == [1, 2]
    assert recs[0]["score"] > recs[1]["score"]
    assert recs[0]["htmlUrl"] == "https://github.com/tools/index-advisor"
    assert all(r["reason"] for r in recs)

    # another user sees neither the recommendations nor the job
    ben = world.person()
    await world.link(ben)
    theirs = (await world.api.get("/github-star-recommendations", headers=ben.headers)).json()
    assert theirs == {"jobId": None, "generatedAt": None, "recommendations": []}
    assert_problem(
        await world.api.get(f"/async-jobs/{job_id}", headers=ben.headers), 404, "NOT_FOUND"
    )

    # a new run replaces the old recommendations
    world.github.set_stars(
        amy.login, stars(3, {1: {"full_name": "tools/pg-only", "topics": ["postgresql"]}})
    )
    second = (await recommend(world, amy))["jobId"]
    assert (await settled_job(world.sessions, second)).status == "COMPLETED"
    listed = (await world.api.get("/github-star-recommendations", headers=amy.headers)).json()
    assert listed["jobId"] == second
    assert [r["repoFullName"] for r in listed["recommendations"]] == ["tools/pg-only"]
    async with world.sessions() as session:
        rows = await session.scalar(
            select(func.count())
            .select_from(GithubStarRecommendation)
            .where(GithubStarRecommendation.user_id == await world.user_id(amy))
        )
    assert rows == 1


async def test_a_revoked_token_fails_the_job_with_the_relink_message(worker_world: World) -> None:
    world = worker_world
    cat = world.person()
    await world.link(cat)
    world.github.revoke(cat.token)
    job = await settled_job(world.sessions, (await recommend(world, cat))["jobId"])
    assert job.status == "FAILED"
    assert job.error_message is not None and RELINK_MESSAGE in job.error_message
    listed = (await world.api.get("/github-star-recommendations", headers=cat.headers)).json()
    assert listed["recommendations"] == []


async def test_not_linked_is_400_and_one_active_job_at_a_time_is_409(world: World) -> None:
    # no worker runs here, so the first job stays PENDING
    dan = world.person()
    response = await world.api.post("/github-star-recommendations", headers=dan.headers)
    assert_problem(response, 400, "GITHUB_NOT_LINKED")
    await world.link(dan)
    first = await recommend(world, dan)
    again = await world.api.post("/github-star-recommendations", headers=dan.headers)
    body = assert_problem(again, 409, "DUPLICATE_RESOURCE")
    assert body["jobId"] == first["jobId"]


async def test_listing_before_any_run_is_empty(world: World) -> None:
    eve = world.person()
    listed = await world.api.get("/github-star-recommendations", headers=eve.headers)
    assert listed.status_code == 200
    assert listed.json() == {"jobId": None, "generatedAt": None, "recommendations": []}
