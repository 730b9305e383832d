"""The caller's profile and time zone."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.api.support import assert_problem


async def test_profile_defaults_to_utc_and_time_zone_can_be_set(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    me = await api.get("/me", headers=headers)
    assert me.status_code == 200
    assert me.json()["timezone"] == "UTC"
    updated = await api.patch("/me", json={"timezone": "Asia/Seoul"}, headers=headers)
    assert updated.status_code == 200, updated.text
    assert (await api.get("/me", headers=headers)).json()["timezone"] == "Asia/Seoul"


async def test_unknown_time_zone_is_rejected_and_nothing_changes(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    for bad in (
        {"timezone": "Mars/Olympus"},
        {"timezone": 9},
        {"tz": "UTC"},
        {"timezone": "x" * 100},
        {"timezone": "localtime"},  # the server's own zone: a file on the host, not a zone
        {"timezone": "posixrules"},
        {"timezone": "Factory"},
        {"timezone": "posix/Asia/Seoul"},
        {"timezone": "../../../etc/localtime"},
    ):
        assert_problem(await api.patch("/me", json=bad, headers=headers), 400, "VALIDATION_ERROR")
    assert (await api.get("/me", headers=headers)).json()["timezone"] == "UTC"
