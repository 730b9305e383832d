"""Linking GitHub (token and OAuth web flow) and connecting repositories, through the real
API in-process against the fake GitHub."""

from __future__ import annotations

import uuid
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from sqlalchemy import select, update

from san_common.crypto import Purpose
from san_common.models import GithubAccount, GithubOAuthState, GithubRepository
from tests.api.support import assert_problem
from tests.fakes.fake_github import FakeGithub
from tests.github.conftest import api_client, github_api_settings
from tests.github.support import Person, World

# -- token linking ------------------------------------------------------------------------------


async def stored_token(world: World, person: Person) -> str:
    async with world.sessions() as session:
        account = await session.get(GithubAccount, await world.user_id(person))
    assert account is not None
    assert person.token not in account.encrypted_token
    return world.cipher.decrypt(
        account.encrypted_token, user_id=account.user_id, purpose=Purpose.GITHUB_TOKEN
    )


async def test_link_validates_with_github_stores_encrypted_and_never_shows_the_token(
    world: World,
) -> None:
    alice = world.person("alice-" + uuid.uuid4().hex[:6])
    linked = await world.link(alice)
    assert linked["login"] == alice.login and linked["githubUserId"]
    assert any(r.path.endswith("/user") and r.token == alice.token for r in world.github.requests)

    shown = await world.api.get("/me/github", headers=alice.headers)
    assert shown.status_code == 200
    assert shown.json()["login"] == alice.login
    assert alice.token not in shown.text
    assert await stored_token(world, alice) == alice.token

    # relinking replaces the token; the account keeps its first link time
    alice.token = world.github.add_user(alice.login)
    relinked = await world.link(alice)
    assert relinked["linkedAt"] == linked["linkedAt"]
    assert await stored_token(world, alice) == alice.token


async def test_a_token_github_rejects_is_not_stored(world: World) -> None:
    bob = world.person()
    world.github.revoke(bob.token)
    response = await world.api.put(
        "/me/github", json={"accessToken": bob.token}, headers=bob.headers
    )
    body = assert_problem(response, 400, "GITHUB_TOKEN_REJECTED")
    assert "relink" in body["detail"]
    assert bob.token not in response.text
    assert_problem(await world.api.get("/me/github", headers=bob.headers), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"accessToken": ""},
        {"accessToken": "has space"},
        {"accessToken": "x" * 256},
        {"accessToken": "fake_ok", "extra": 1},
    ],
)
async def test_malformed_link_requests_are_400_and_never_echo_the_token(
    world: World, body: dict[str, object]
) -> None:
    carol = world.person()
    response = await world.api.put("/me/github", json=body, headers=carol.headers)
    assert_problem(response, 400, "VALIDATION_ERROR")
    assert "has space" not in response.text
    assert not [r for r in world.github.requests if r.token == body.get("accessToken")]


@pytest.mark.parametrize(("kind", "retry_after"), [("http_500", None), ("http_429", 2)])
async def test_github_down_or_rate_limiting_while_linking_is_503(
    world: World, kind: str, retry_after: int | None
) -> None:
    dave = world.person()
    world.github.add_fault(kind, token=dave.token)  # type: ignore[arg-type]
    response = await world.api.put(
        "/me/github", json={"accessToken": dave.token}, headers=dave.headers
    )
    body = assert_problem(response, 503, "GITHUB_UNAVAILABLE")
    assert body.get("retryAfterSeconds") == retry_after
    assert_problem(await world.api.get("/me/github", headers=dave.headers), 404, "NOT_FOUND")


async def test_unlink_forgets_the_token(world: World) -> None:
    erin = world.person()
    await world.link(erin)
    assert (await world.api.delete("/me/github", headers=erin.headers)).status_code == 204
    assert_problem(await world.api.get("/me/github", headers=erin.headers), 404, "NOT_FOUND")
    assert_problem(await world.api.delete("/me/github", headers=erin.headers), 404, "NOT_FOUND")
    async with world.sessions() as session:
        assert await session.get(GithubAccount, await world.user_id(erin)) is None


async def test_github_endpoints_need_a_bearer_token(world: World) -> None:
    for method, path in (
        ("GET", "/me/github"),
        ("GET", "/me/github/repositories"),
        ("POST", "/github-star-recommendations"),
    ):
        assert_problem(await world.api.request(method, path), 401, "UNAUTHORIZED")


# -- repositories -------------------------------------------------------------------------------


async def test_connect_list_and_disconnect_a_repository(world: World) -> None:
    frank = world.person("Frank-" + uuid.uuid4().hex[:6])
    world.github.add_repo(frank.login, "Til-Notes")
    await world.link(frank)
    created = await world.api.post(
        "/me/github/repositories",
        json={
            "owner": frank.login.lower(),
            "name": "til-notes",
            "branch": "main",
            "directory": " notes/daily/ ",
        },
        headers=frank.headers,
    )
    assert created.status_code == 201, created.text
    repo = created.json()
    # stored as GitHub spells it, with a normalized folder
    assert (repo["owner"], repo["name"], repo["branch"], repo["directory"]) == (
        frank.login,
        "Til-Notes",
        "main",
        "notes/daily",
    )

    again = await world.api.post(
        "/me/github/repositories",
        json={"owner": frank.login, "name": "TIL-NOTES"},
        headers=frank.headers,
    )
    assert_problem(again, 409, "DUPLICATE_RESOURCE")

    listed = await world.api.get("/me/github/repositories", headers=frank.headers)
    assert [r["repositoryId"] for r in listed.json()["repositories"]] == [repo["repositoryId"]]

    stranger = world.person()
    await world.link(stranger)
    assert (await world.api.get("/me/github/repositories", headers=stranger.headers)).json() == {
        "repositories": []
    }
    path = f"/me/github/repositories/{repo['repositoryId']}"
    assert_problem(await world.api.delete(path, headers=stranger.headers), 404, "NOT_FOUND")
    assert (await world.api.delete(path, headers=frank.headers)).status_code == 204
    assert (await world.api.get("/me/github/repositories", headers=frank.headers)).json() == {
        "repositories": []
    }


async def test_repository_checks_each_have_their_own_code(world: World) -> None:
    gina = world.person()
    body = {"owner": gina.login, "name": "til"}
    response = await world.api.post("/me/github/repositories", json=body, headers=gina.headers)
    assert_problem(response, 400, "GITHUB_NOT_LINKED")

    await world.link(gina)
    response = await world.api.post("/me/github/repositories", json=body, headers=gina.headers)
    assert_problem(response, 400, "GITHUB_REPOSITORY_NOT_FOUND")

    world.github.add_repo("someone-else", "shared", pushers={"someone-else"})
    response = await world.api.post(
        "/me/github/repositories",
        json={"owner": "someone-else", "name": "shared"},
        headers=gina.headers,
    )
    assert_problem(response, 400, "REPOSITORY_NOT_WRITABLE")
    async with world.sessions() as session:
        rows = await session.scalars(
            select(GithubRepository).where(GithubRepository.user_id == await world.user_id(gina))
        )
        assert list(rows) == []


@pytest.mark.parametrize(
    "body",
    [
        {"owner": "-bad", "name": "til"},
        {"owner": "a--b", "name": "til"},
        {"owner": "ok", "name": ".."},
        {"owner": "ok", "name": "has space"},
        {"owner": "ok", "name": "til", "branch": "bad..branch"},
        {"owner": "ok", "name": "til", "branch": "ends.lock"},
        {"owner": "ok", "name": "til", "directory": "../escape"},
        {"owner": "ok", "name": "til", "directory": "a//b"},
        {"owner": "ok", "name": "til", "directory": "/"},
        {"owner": "ok"},
    ],
)
async def test_malformed_repositories_are_400(world: World, body: dict[str, str]) -> None:
    hank = world.person()
    await world.link(hank)
    before = len(world.github.requests)
    response = await world.api.post("/me/github/repositories", json=body, headers=hank.headers)
    assert_problem(response, 400, "VALIDATION_ERROR")
    assert len(world.github.requests) == before  # refused before asking GitHub


# -- OAuth web flow -----------------------------------------------------------------------------


async def test_oauth_happy_path_stores_a_validated_token(world: World) -> None:
    ivy = world.person()
    code, state = await world.authorize(ivy)
    landed = await world.callback(code=code, state=state)
    assert landed.status_code == 200, landed.text
    assert landed.json() | {"next": ""} == {
        "code": code,
        "state": state,
        "linked": False,
        "next": "",
    }
    assert_problem(await world.api.get("/me/github", headers=ivy.headers), 404, "NOT_FOUND")

    done = await world.complete(ivy, code=code, state=state)
    assert done.status_code == 200, done.text
    assert done.json()["login"] == ivy.login
    assert ivy.token not in done.text
    assert (await world.api.get("/me/github", headers=ivy.headers)).json()["login"] == ivy.login
    assert await stored_token(world, ivy) == ivy.token
    # GET /user re-validated the token the code exchange handed out
    exchange = next(
        i for i, r in enumerate(world.github.requests) if r.path.endswith("access_token")
    )
    assert any(
        r.path.endswith("/user") and r.token == ivy.token for r in world.github.requests[exchange:]
    )
    async with world.sessions() as session:
        states = list(
            await session.scalars(
                select(GithubOAuthState).where(GithubOAuthState.user_id == await world.user_id(ivy))
            )
        )
    assert len(states) == 1 and states[0].used_at is not None
    assert state not in states[0].state_hash  # only a hash of the state is kept


async def test_the_attackers_authorize_url_completed_by_the_victim_links_nothing(
    world: World,
) -> None:
    """Account-linking CSRF: mallory starts the flow and sends victor the authorize URL.
    Victor's browser, signed in at GitHub, follows it and lands on the callback."""
    mallory, victor = world.person(), world.person()
    started = await world.api.get("/me/github/oauth/authorize", headers=mallory.headers)
    world.github.authorize_as(victor.token)  # victor is the one signed in at GitHub
    async with httpx.AsyncClient() as victors_browser:
        consent = await victors_browser.get(started.json()["authorizeUrl"])
    back = parse_qs(urlsplit(consent.headers["location"]).query)
    code, state = back["code"][0], back["state"][0]

    # the redirect itself, in victor's browser (no SAN credential), links nothing
    landed = await world.callback(code=code, state=state)
    assert landed.status_code == 200 and landed.json()["linked"] is False
    # victor's signed-in client completing it: refused, and it says why
    refused = await world.complete(victor, code=code, state=state)
    body = assert_problem(refused, 403, "OAUTH_STATE_NOT_YOURS")
    assert "another SAN account" in body["detail"] and "nothing was linked" in body["detail"]
    # the refusal burnt the state: mallory cannot redeem victor's code afterwards
    assert_problem(
        await world.complete(mallory, code=code, state=state), 400, "OAUTH_STATE_INVALID"
    )
    for person in (mallory, victor):
        assert_problem(await world.api.get("/me/github", headers=person.headers), 404, "NOT_FOUND")
    # GitHub was never asked to exchange victor's code
    assert not [r for r in world.github.requests if r.path.endswith("access_token")]
    assert victor.token not in refused.text


async def test_oauth_completion_needs_a_bearer_token(world: World) -> None:
    ivy = world.person()
    code, state = await world.authorize(ivy)
    response = await world.api.post(
        "/me/github/oauth/complete", json={"code": code, "state": state}
    )
    assert_problem(response, 401, "UNAUTHORIZED")
    # the state is untouched: its owner still completes
    assert (await world.complete(ivy, code=code, state=state)).status_code == 200


async def test_oauth_missing_wrong_reused_or_expired_state_is_rejected(world: World) -> None:
    jack = world.person()
    code, state = await world.authorize(jack)
    assert_problem(await world.callback(code=code), 400, "OAUTH_STATE_INVALID")
    assert_problem(await world.callback(code=code, state=""), 400, "OAUTH_STATE_INVALID")
    assert_problem(await world.callback(state=state), 400, "OAUTH_CODE_REJECTED")
    wrong = await world.complete(jack, code=code, state=state + "x")
    assert_problem(wrong, 400, "OAUTH_STATE_INVALID")
    missing = await world.api.post(
        "/me/github/oauth/complete", json={"code": code}, headers=jack.headers
    )
    assert_problem(missing, 400, "VALIDATION_ERROR")
    assert (await world.complete(jack, code=code, state=state)).status_code == 200
    # replay, by the same user or anyone else
    assert_problem(await world.complete(jack, code=code, state=state), 400, "OAUTH_STATE_INVALID")
    other = world.person()
    assert_problem(await world.complete(other, code=code, state=state), 400, "OAUTH_STATE_INVALID")

    kim = world.person()
    code, state = await world.authorize(kim)
    async with world.sessions() as session, session.begin():
        await session.execute(
            update(GithubOAuthState)
            .where(GithubOAuthState.user_id == await world.user_id(kim))
            .values(expires_at=GithubOAuthState.created_at - timedelta(seconds=1))
        )
    assert_problem(await world.complete(kim, code=code, state=state), 400, "OAUTH_STATE_INVALID")
    assert_problem(await world.api.get("/me/github", headers=kim.headers), 404, "NOT_FOUND")


async def test_a_code_issued_for_another_flow_fails_pkce(world: World) -> None:
    """An attacker's own code, injected into the victim's completion, fails PKCE."""
    victim, attacker = world.person(), world.person()
    _, victim_state = await world.authorize(victim)
    attacker_code, _ = await world.authorize(attacker)
    response = await world.complete(victim, code=attacker_code, state=victim_state)
    body = assert_problem(response, 400, "OAUTH_CODE_REJECTED")
    assert "bad_verification_code" in body["detail"]
    assert_problem(await world.api.get("/me/github", headers=victim.headers), 404, "NOT_FOUND")
    assert attacker.token not in response.text


async def test_oauth_denied_by_the_user_is_rejected(world: World) -> None:
    liam = world.person()
    _, state = await world.authorize(liam)
    response = await world.callback(error="access_denied", state=state)
    assert_problem(response, 400, "OAUTH_CODE_REJECTED")
    assert_problem(await world.api.get("/me/github", headers=liam.headers), 404, "NOT_FOUND")


async def test_oauth_without_a_configured_app_is_503(
    db_url: str, amqp_url: str, fake_github: FakeGithub, world: World
) -> None:
    settings = github_api_settings(db_url, amqp_url, fake_github, github_client_id="")
    mia = world.person()
    async with api_client(settings) as client:
        response = await client.get("/me/github/oauth/authorize", headers=mia.headers)
    assert_problem(response, 503, "OAUTH_NOT_CONFIGURED")
