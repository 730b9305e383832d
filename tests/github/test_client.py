"""The shared GitHub client against the fake GitHub: GitHub's semantics, pagination, and how
each failure is classified (what the worker retries, waits for, or fails at once)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest

from san_common.errors import PermanentJobError, TransientJobError
from san_common.github import (
    RELINK_MESSAGE,
    GithubClient,
    GithubNotFound,
    GithubPermanentError,
    GithubRateLimited,
    GithubTokenRejected,
    GithubTransientError,
    git_blob_sha,
)
from tests.fakes.fake_github import FakeGithub

NOW = 1_900_000_000.0


@pytest.fixture
async def client(fake_github: FakeGithub) -> AsyncIterator[GithubClient]:
    client = GithubClient(fake_github.api_url, timeout_seconds=0.5)
    yield client
    await client.aclose()


async def test_user_and_repository_with_github_enterprise_base_path(
    fake_github: FakeGithub, client: GithubClient
) -> None:
    token = fake_github.add_user("Octo-Cat")
    fake_github.add_repo("Octo-Cat", "Notes", pushers={"Octo-Cat"})
    user = await client.get_user(token)
    assert user.login == "Octo-Cat" and isinstance(user.id, int)
    repo = await client.get_repository(token, "octo-cat", "notes")
    assert (repo.owner, repo.name, repo.can_push) == ("Octo-Cat", "Notes", True)
    assert all(r.path.startswith("/api/v3/") for r in fake_github.requests)

    stranger = fake_github.add_user("someone")
    assert (await client.get_repository(stranger, "Octo-Cat", "Notes")).can_push is False
    with pytest.raises(GithubNotFound):
        await client.get_repository(token, "Octo-Cat", "missing")


async def test_contents_put_creates_then_github_refuses_blind_or_stale_overwrites(
    fake_github: FakeGithub, client: GithubClient
) -> None:
    token = fake_github.add_user("alice")
    fake_github.add_repo("alice", "til")
    path = "TIL/2026-12-02.md"
    assert await client.get_contents(token, "alice", "til", path) is None

    commit = await client.put_contents(
        token, "alice", "til", path, content=b"# hello\n", message="Add TIL 2026-12-02"
    )
    assert len(commit.sha) == 40 and commit.html_url
    found = await client.get_contents(token, "alice", "til", path)
    assert found is not None and found.type == "file"
    assert found.sha == git_blob_sha(b"# hello\n")  # git's blob sha, as GitHub reports it
    folder = await client.get_contents(token, "alice", "til", "TIL")
    assert folder is not None and folder.type == "dir"

    with pytest.raises(GithubPermanentError) as missing_sha:
        await client.put_contents(token, "alice", "til", path, content=b"x", message="m")
    assert missing_sha.value.status == 422
    with pytest.raises(GithubPermanentError) as stale:
        await client.put_contents(
            token, "alice", "til", path, content=b"x", message="m", sha=git_blob_sha(b"old")
        )
    assert stale.value.status == 409
    updated = await client.put_contents(
        token, "alice", "til", path, content=b"x", message="m", sha=found.sha
    )
    assert updated.sha != commit.sha
    statuses = [r.status for r in fake_github.requests if r.method == "PUT"]
    assert statuses == [201, 422, 409, 200]
    last = await client.last_commit_for_path(token, "alice", "til", path)
    assert last is not None and last.sha == updated.sha


async def test_stars_follow_link_pagination_100_per_page(
    fake_github: FakeGithub, client: GithubClient
) -> None:
    token = fake_github.add_user("stargazer")
    fake_github.set_stars(
        "stargazer",
        [
            {
                "full_name": f"org/repo{i}",
                "description": f"d{i}",
                "topics": ["t"],
                "language": "Go",
                "html_url": f"https://github.com/org/repo{i}",
            }
            for i in range(250)
        ],
    )
    stars = await client.starred(token)
    assert [s.full_name for s in stars] == [f"org/repo{i}" for i in range(250)]
    pages = [r for r in fake_github.requests if r.path.endswith("/user/starred")]
    assert [(r.query.get("per_page"), r.query.get("page", "1")) for r in pages] == [
        ("100", "1"),
        ("100", "2"),
        ("100", "3"),
    ]


async def test_a_next_link_to_another_host_never_gets_the_token() -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(
            200, json=[], headers={"link": '<https://evil.example/steal?page=2>; rel="next"'}
        )

    client = GithubClient("https://api.github.test", transport=httpx.MockTransport(answer))
    try:
        with pytest.raises(GithubPermanentError, match="another host"):
            await client.starred("fake_secret_token")
    finally:
        await client.aclose()
    assert seen == ["https://api.github.test/user/starred?per_page=100"]


async def test_revoked_token_is_permanent_with_the_relink_message(
    fake_github: FakeGithub, client: GithubClient
) -> None:
    token = fake_github.add_user()
    fake_github.revoke(token)
    with pytest.raises(GithubTokenRejected) as caught:
        await client.get_user(token)
    assert isinstance(caught.value, PermanentJobError)
    assert str(caught.value).startswith(RELINK_MESSAGE)
    assert token not in str(caught.value)


@pytest.mark.parametrize(("kind", "status"), [("http_429", 429), ("http_403_retry_after", 403)])
async def test_retry_after_becomes_the_wait(
    fake_github: FakeGithub, client: GithubClient, kind: str, status: int
) -> None:
    token = fake_github.add_user()
    fake_github.add_fault(kind, retry_after="2")  # type: ignore[arg-type]
    with pytest.raises(GithubRateLimited) as caught:
        await client.get_user(token)
    assert isinstance(caught.value, TransientJobError)
    assert (caught.value.status, caught.value.retry_after) == (status, 2.0)


async def test_exhausted_primary_limit_waits_until_its_reset(fake_github: FakeGithub) -> None:
    token = fake_github.add_user()
    fake_github.add_fault("http_403_reset", reset_in=2)
    clock_now = int(time.time()) - 5.0  # an injected clock: the wait is reset − now, exactly
    client = GithubClient(fake_github.api_url, clock=lambda: clock_now)
    try:
        with pytest.raises(GithubRateLimited) as caught:
            await client.get_user(token)
    finally:
        await client.aclose()
    reset = int(fake_github.requests[-1].wall + 2)
    assert caught.value.retry_after == pytest.approx(reset - clock_now, abs=1)
    assert caught.value.retry_after >= 6


async def test_server_errors_resets_and_timeouts_are_transient(
    fake_github: FakeGithub, client: GithubClient
) -> None:
    token = fake_github.add_user()
    fake_github.delay_seconds = 2.0
    for kind, expected in (
        ("http_500", "500"),
        ("reset", "connection failed"),
        ("timeout", "timed out"),
    ):
        fake_github.add_fault(kind)  # type: ignore[arg-type]
        with pytest.raises(GithubTransientError, match=expected) as caught:
            await client.get_user(token)
        assert caught.value.retry_after is None
    assert (await client.get_user(token)).login  # and the client is fine afterwards


async def test_forbidden_without_rate_limit_is_permanent_and_messages_never_carry_the_token(
    fake_github: FakeGithub, client: GithubClient
) -> None:
    token = fake_github.add_user("bob")
    fake_github.add_repo("carol", "theirs", pushers={"carol"})
    with pytest.raises(GithubPermanentError) as forbidden:
        await client.put_contents(token, "carol", "theirs", "a.md", content=b"x", message="m")
    assert forbidden.value.status == 403
    assert not isinstance(forbidden.value, GithubRateLimited)

    fake_github.add_fault("http_422_echo")  # GitHub quoting our Authorization header back
    with pytest.raises(GithubPermanentError) as echoed:
        await client.get_user(token)
    assert token not in str(echoed.value)
    assert "[REDACTED]" in str(echoed.value)
