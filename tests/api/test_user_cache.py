"""The API remembers provisioned users (san_api.users.cache) but only committed ones: a
request that created its user and then failed rolled the user back, and the next request
must provision again rather than use the rolled-back id."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx

from san_api.users.cache import ProvisionedUsers
from tests.api.support import Sessions, footprint, save_scrap


async def test_a_user_created_by_a_failed_request_is_provisioned_again(
    api: httpx.AsyncClient, sessions: Sessions, token: Callable[[str], str]
) -> None:
    subject = "rolled-back-" + uuid.uuid4().hex
    headers = {"Authorization": f"Bearer {token(subject)}"}

    refused = await api.post("/scraps", json={"content": "   "}, headers=headers)
    assert refused.status_code == 400, refused.text
    assert (await footprint(sessions, subject)).users == 0  # the 400 rolled the user back

    await save_scrap(api, headers)
    await save_scrap(api, headers)  # the second request runs on the remembered user id
    after = await footprint(sessions, subject)
    assert (after.users, after.scraps) == (1, 2)


def test_the_cache_forgets_the_least_recently_used_subject_first() -> None:
    cache = ProvisionedUsers(capacity=2)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    cache.remember("a", a)
    cache.remember("b", b)
    assert cache.get("a") == a  # a is now the most recently used
    cache.remember("c", c)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (a, None, c)
