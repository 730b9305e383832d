"""Tokens at rest (docs/reference/job-rules.md §4): never in plaintext in any column of any table,
bound to their user, and rotatable to a new key with `san-token-keys rotate`.

(That no token reaches the logs is checked after every test of this suite, see conftest.py,
and for the service processes in test_e2e_github.py.)
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import delete, select, text, update

from san_common.crypto import Purpose, TokenCipher, generate_key, key_id, parse_keys
from san_common.github import GithubClient, keys
from san_common.models import GithubAccount, GithubOAuthState
from tests.api.support import assert_problem
from tests.conftest import TOKEN_KEYS
from tests.github.conftest import api_client, github_api_settings
from tests.github.support import World
from tests.waiting import settled_job


async def text_columns(world: World) -> list[tuple[str, str]]:
    """Every column of every table (all cast to text by the scan, bytea as hex)."""
    async with world.sessions() as session:
        rows = await session.execute(
            text(
                "SELECT c.table_name, c.column_name FROM information_schema.columns c "
                "JOIN information_schema.tables t USING (table_schema, table_name) "
                "WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' "
                "AND c.udt_name <> 'vector' ORDER BY 1, 2"
            )
        )
        return [(table, column) for table, column in rows.all()]


async def holders(world: World, secret: str, columns: list[tuple[str, str]]) -> list[str]:
    forms = [secret, secret.encode().hex(), base64.b64encode(secret.encode()).decode().rstrip("=")]
    found = []
    async with world.sessions() as session:
        for table, column in columns:
            hits = await session.scalar(
                text(f'SELECT count(*) FROM "{table}" WHERE "{column}"::text ILIKE ANY(:patterns)'),
                {"patterns": [f"%{form}%" for form in forms]},
            )
            if hits:
                found.append(f"{table}.{column}")
    return found


@pytest.mark.rabbit
async def test_no_token_in_plaintext_anywhere_in_the_database(worker_world: World) -> None:
    world = worker_world
    # every way a token enters or passes through the system
    by_token = await world.ready()
    summary = await world.til(by_token)
    commit = (await world.commit(by_token, summary)).json()
    stars = (await world.api.post("/github-star-recommendations", headers=by_token.headers)).json()
    by_oauth = world.person()
    code, state = await world.authorize(by_oauth)
    assert (await world.complete(by_oauth, code=code, state=state)).status_code == 200
    await world.authorize(world.person())  # a flow left pending: its verifier is stored
    revoked = await world.ready()
    world.github.revoke(revoked.token)
    failing = (await world.api.post("/github-star-recommendations", headers=revoked.headers)).json()
    for job_id in (commit["jobId"], stars["jobId"], failing["jobId"]):
        await settled_job(world.sessions, job_id)
    assert (await world.job(failing["jobId"])).status == "FAILED"  # an error_message exists

    columns = await text_columns(world)
    assert ("github_accounts", "encrypted_token") in columns
    assert ("github_oauth_states", "encrypted_code_verifier") in columns
    assert ("outbox_messages", "body") in columns and ("async_jobs", "error_message") in columns
    # the scan finds what is there (so an empty result below means something)
    assert await holders(world, by_oauth.login, columns) == ["github_accounts.login"]
    for token in world.github.issued_tokens:
        assert await holders(world, token, columns) == [], "a token is stored in plaintext"
    assert await holders(world, world.github.client_secret, columns) == []


async def test_a_token_copied_into_another_users_row_does_not_decrypt(fresh_world: World) -> None:
    world = fresh_world
    alice, bob = await world.ready(), await world.ready()
    async with world.sessions() as session, session.begin():
        stolen = await session.scalar(
            select(GithubAccount.encrypted_token).where(
                GithubAccount.user_id == await world.user_id(alice)
            )
        )
        await session.execute(
            update(GithubAccount)
            .where(GithubAccount.user_id == await world.user_id(bob))
            .values(encrypted_token=stolen)
        )
    seen = len(world.github.requests_with(alice.token))
    response = await world.commit(bob, await world.til(bob))
    body = assert_problem(response, 400, "GITHUB_TOKEN_REJECTED")
    assert "cannot be decrypted" in body["detail"]
    assert len(world.github.requests_with(alice.token)) == seen  # alice's token was never used


def rotate(db_url: str, keys: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "TOKEN_ENCRYPTION_KEYS": keys,
        "SAN_ENV": "test",
        "DATA_DIR": str(data_dir),
    }
    return subprocess.run(
        [sys.executable, "-m", "san_common.github.keys", "rotate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_key_rotation_keeps_every_token_working(
    fresh_world: World, fresh_db_url: str, amqp_url: str, tmp_path: Path
) -> None:
    world = fresh_world
    people = [await world.ready() for _ in range(3)]
    pending = world.person()
    code, state = await world.authorize(pending)  # a verifier encrypted with the old key
    # a value under a key nobody has any more: reported, never silently dropped
    stray = await world.ready()
    async with world.sessions() as session, session.begin():
        await session.execute(
            update(GithubAccount)
            .where(GithubAccount.user_id == await world.user_id(stray))
            .values(
                encrypted_token=TokenCipher.from_setting(generate_key()).encrypt(
                    stray.token, user_id=await world.user_id(stray), purpose=Purpose.GITHUB_TOKEN
                )
            )
        )

    new_key = generate_key()
    new_kid = key_id(parse_keys(new_key)[0])
    first = await asyncio.to_thread(rotate, fresh_db_url, f"{new_key},{TOKEN_KEYS}", tmp_path)
    assert first.returncode == 1, first.stderr
    assert "github tokens: re-encrypted 3, already current 0, undecryptable 1" in first.stdout
    assert "oauth verifiers: re-encrypted 1, already current 0, undecryptable 0" in first.stdout
    assert not any(p.token in first.stdout + first.stderr for p in [*people, stray])

    async with world.sessions() as session, session.begin():
        await session.execute(
            delete(GithubAccount).where(GithubAccount.user_id == await world.user_id(stray))
        )
    # running it again (in-process this time) is harmless: everything is current
    again = await keys.rotate(world.sessions, TokenCipher.from_setting(f"{new_key},{TOKEN_KEYS}"))
    assert (again.accounts.reencrypted, again.accounts.current, again.complete) == (0, 3, True)

    async with world.sessions() as session:
        stored = list(await session.scalars(select(GithubAccount.encrypted_token)))
        verifiers = list(await session.scalars(select(GithubOAuthState.encrypted_code_verifier)))
    assert len(stored) == 3 and all(value.split(":")[1] == new_kid for value in stored)
    assert all(value.split(":")[1] == new_kid for value in verifiers)

    # the old key dropped: an API knowing only the new key uses every token and the flow
    settings = github_api_settings(
        fresh_db_url, amqp_url, world.github, token_encryption_keys=new_key
    )
    async with api_client(settings) as api:
        for person in people:
            world.github.add_repo(person.login, "second")
            used = len(world.github.requests_with(person.token))
            response = await api.post(
                "/me/github/repositories",
                json={"owner": person.login, "name": "second"},
                headers=person.headers,
            )
            assert response.status_code == 201, response.text
            assert len(world.github.requests_with(person.token)) == used + 1
        finished = await api.post(
            "/me/github/oauth/complete",
            json={"code": code, "state": state},
            headers=pending.headers,
        )
        assert finished.status_code == 200, finished.text

    client = GithubClient(world.github.api_url)
    try:
        only_new = TokenCipher.from_setting(new_key)
        for person in people:
            async with world.sessions() as session:
                value = await session.scalar(
                    select(GithubAccount.encrypted_token).where(
                        GithubAccount.user_id == await world.user_id(person)
                    )
                )
            assert value is not None
            token = only_new.decrypt(
                value, user_id=await world.user_id(person), purpose=Purpose.GITHUB_TOKEN
            )
            assert (await client.get_user(token)).login == person.login
    finally:
        await client.aclose()
