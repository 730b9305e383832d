"""GitHub's error text never reaches a user (docs/security.md, "Errors"): a 403 whose body
holds markup, an internal host name and a credential-shaped string is answered to the user as
a short summary (the kind of failure and GitHub's status) — by the synchronous routes
(`PUT /me/github`, repository linking, the OAuth completion, `POST …/github-commits`) and by
everything that shows a failed commit job (`GET /til/{id}/github-commits`, the job, its event
stream). The operator's job detail has the full message, the credential redacted."""

from __future__ import annotations

from datetime import timedelta

import pytest

from san_api.auth.tokens import mint
from tests.conftest import JWT_SECRET
from tests.github.support import DAY, World
from tests.waiting import settled_job

pytestmark = pytest.mark.rabbit

MARKUP = "<script>alert(document.cookie)</script>"
HOST = "ghe-internal.corp.example"
CREDENTIAL = "ghp_PLANTEDplanted0123456789abcdef"
PLANTED = f" {MARKUP} (served by {HOST}, token {CREDENTIAL})"
OPERATOR = {"Authorization": f"Bearer {mint(JWT_SECRET, 'ops', role='operator')}"}


def _leaks(text: str) -> list[str]:
    return [p for p in (MARKUP, "<script", HOST, CREDENTIAL, "not accessible") if p in text]


async def test_a_planted_github_403_reaches_no_user_and_the_operator_sees_it_redacted(
    worker_world: World,
) -> None:
    world = worker_world
    world.github.error_detail = PLANTED
    person = await world.ready()
    summary = await world.til(person)

    # the commit job: GitHub refuses the PUT (a 403 that is no rate limit: permanent)
    world.github.add_fault("http_403", method="PUT", times=None)
    accepted = await world.commit(person, summary)
    assert accepted.status_code == 202, accepted.text
    job_id, commit_id = accepted.json()["jobId"], accepted.json()["commitId"]
    job = await settled_job(world.sessions, job_id)
    assert job.status == "FAILED"
    world.github.clear_faults()

    shown = {
        path: await world.api.get(path, headers=person.headers)
        for path in (
            f"/til/{summary}/github-commits",
            f"/async-jobs/{job_id}",
            f"/async-jobs/{job_id}/events",
        )
    }
    for path, response in shown.items():
        assert response.status_code == 200, (path, response.text)
        assert not _leaks(response.text), (path, response.text)
    [commit] = shown[f"/til/{summary}/github-commits"].json()["commits"]
    assert commit["commitId"] == commit_id and commit["status"] == "FAILED"
    assert "403" in commit["errorMessage"], commit  # what failed, without GitHub's words

    # the synchronous routes that call GitHub, each refused with the planted body
    stranger = world.person()
    world.github.add_fault("http_403", path_contains="/user", times=1)
    linked = await world.api.put(
        "/me/github", json={"accessToken": stranger.token}, headers=stranger.headers
    )
    world.github.add_fault("http_403", path_contains="/repos/", times=1)
    connected = await world.api.post(
        "/me/github/repositories",
        json={"owner": person.login, "name": "other"},
        headers=person.headers,
    )
    world.github.add_fault("http_403", path_contains="/contents/", times=1)
    again = await world.commit(person, await world.til(person, day=DAY + timedelta(days=1)))
    code, state = await world.authorize(stranger)
    world.github.add_fault("http_403", path_contains="/login/oauth/access_token", times=1)
    completed = await world.complete(stranger, code=code, state=state)
    for name, response in (
        ("PUT /me/github", linked),
        ("POST /me/github/repositories", connected),
        ("POST /til/{id}/github-commits", again),
        ("POST /me/github/oauth/complete", completed),
    ):
        assert response.status_code in (400, 502), (name, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        assert not _leaks(response.text), (name, response.text)
        assert "403" in response.json()["detail"], (name, response.text)

    # the operator: the full message, GitHub's words included, the credential redacted
    detail = (await world.api.get(f"/admin/api/jobs/{job_id}", headers=OPERATOR)).json()
    chain = detail["job"]["errorMessage"]
    assert MARKUP in chain and HOST in chain, chain
    assert CREDENTIAL not in chain and "[REDACTED]" in chain, chain
