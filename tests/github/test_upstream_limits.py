"""Routes that call GitHub or store state per request are rate-limited per user
(docs/security.md, "Rate limits and quotas"): `PUT /me/github`, the OAuth authorize/complete
pair and repository linking each take a token of `RATE_LIMIT_GITHUB_BURST` /
`RATE_LIMIT_GITHUB_PER_MINUTE` before they call GitHub, so a flood cannot use SAN to test
tokens against GitHub or to fill a table; and a user keeps at most
`GITHUB_OAUTH_STATES_PER_USER` unused OAuth states."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from san_common.crypto import TokenCipher
from san_common.db.engine import create_session_factory
from san_common.models import GithubOAuthState
from tests.api.support import assert_problem
from tests.conftest import TOKEN_KEYS
from tests.fakes.fake_github import FakeGithub
from tests.github.conftest import api_client, github_api_settings
from tests.github.support import World

BURST, PER_MINUTE = 5, 6.0  # the defaults


@pytest.fixture
async def limited(
    db_url: str, amqp_url: str, fake_github: FakeGithub, engine: AsyncEngine
) -> AsyncIterator[World]:
    """The API with the GitHub routes' default limits (the suite's other tests lift them)."""
    settings = github_api_settings(
        db_url,
        amqp_url,
        fake_github,
        rate_limit_github_burst=BURST,
        rate_limit_github_per_minute=PER_MINUTE,
    )
    async with api_client(settings) as client:
        yield World(
            fake_github,
            client,
            create_session_factory(engine),
            TokenCipher.from_setting(TOKEN_KEYS),
        )


def _refused(response: httpx.Response) -> None:
    body = assert_problem(response, 429, "RATE_LIMITED")
    assert int(response.headers["retry-after"]) >= 1 and body["retryAfterSeconds"] >= 1


async def test_sixty_token_links_in_ten_seconds_reach_github_at_most_the_burst(
    limited: World,
) -> None:
    world = limited
    prober, bystander = world.person(), world.person()
    started = time.monotonic()
    answers = await asyncio.gather(
        *(
            world.api.put("/me/github", json={"accessToken": prober.token}, headers=prober.headers)
            for _ in range(60)
        )
    )
    elapsed = time.monotonic() - started
    assert elapsed < 10, elapsed

    allowed = BURST + math.floor(elapsed * PER_MINUTE / 60)
    calls = [r for r in world.github.requests_with(prober.token) if r.path.endswith("/user")]
    assert len(calls) <= allowed, (len(calls), allowed)
    served = [a for a in answers if a.status_code == 200]
    assert len(served) == len(calls) >= BURST - 1, [a.status_code for a in answers]
    for answer in answers:
        if answer.status_code != 200:
            _refused(answer)
    # per user: someone else links at once
    assert (await world.link(bystander))["login"] == bystander.login


@pytest.mark.parametrize(
    "route",
    ["PUT /me/github", "authorize", "complete", "POST /me/github/repositories"],
)
async def test_every_route_that_calls_github_is_limited_per_user(
    db_url: str, amqp_url: str, fake_github: FakeGithub, engine: AsyncEngine, route: str
) -> None:
    settings = github_api_settings(
        db_url, amqp_url, fake_github, rate_limit_github_burst=1, rate_limit_github_per_minute=0.5
    )
    async with api_client(settings) as api:
        cipher = TokenCipher.from_setting(TOKEN_KEYS)
        world = World(fake_github, api, create_session_factory(engine), cipher)
        person = world.person()
        fake_github.add_repo(person.login, "til")

        async def call() -> httpx.Response:
            if route == "PUT /me/github":
                body = {"accessToken": person.token}
                return await api.put("/me/github", json=body, headers=person.headers)
            if route == "authorize":
                return await api.get("/me/github/oauth/authorize", headers=person.headers)
            if route == "complete":
                body = {"code": "c" * 20, "state": "s" * 43}
                return await api.post(
                    "/me/github/oauth/complete", json=body, headers=person.headers
                )
            body = {"owner": person.login, "name": "til"}
            return await api.post("/me/github/repositories", json=body, headers=person.headers)

        first = await call()
        assert first.status_code != 429, first.text
        before = len(fake_github.requests)
        _refused(await call())
        assert len(fake_github.requests) == before  # refused before any GitHub call


async def test_a_user_keeps_at_most_the_configured_unused_oauth_states(world: World) -> None:
    person = world.person()
    states = [await world.authorize(person) for _ in range(12)]
    async with world.sessions() as session:
        kept = await session.scalar(
            select(func.count())
            .select_from(GithubOAuthState)
            .where(GithubOAuthState.user_id == await world.user_id(person))
        )
    assert kept == 5  # GITHUB_OAUTH_STATES_PER_USER
    # the oldest flows are void; the newest still completes
    code, state = states[0]
    assert_problem(await world.complete(person, code=code, state=state), 400, "OAUTH_STATE_INVALID")
    code, state = states[-1]
    assert (await world.complete(person, code=code, state=state)).status_code == 200
