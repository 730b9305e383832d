"""`?notice=` is a key into a fixed set of messages (docs/security.md, "Small ones"): a page
shows that key's message with checked parameters, and nothing a link carries as text."""

from __future__ import annotations

import re

import httpx
import pytest

from san_api.admin import notices
from tests.admin.support import operator_headers


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ("notice=paused&type=CARD_ANALYSIS", "CARD_ANALYSIS paused"),
        ("notice=bulk-retry&count=12", "retry: 12 job(s)"),
        ("notice=sweeps-requested&sweeps=ghost,failed", "requested: ghost, failed"),
        ("notice=refused&code=CONFLICT&error=1", "refused: The resource is not in a state"),
    ],
)
async def test_a_known_key_shows_its_message(
    api: httpx.AsyncClient, query: str, shown: str
) -> None:
    # a name of no digits: a random one ("op-d36a1555") could hold a word looked for
    page = await api.get(f"/admin?{query}", headers=operator_headers("op-notices"))
    assert page.status_code == 200
    assert shown in page.text, page.text[:2000]


@pytest.mark.parametrize(
    "query",
    [
        "notice=Your+session+expired.+Sign+in+again+at+evil.example",  # text, not a key
        "notice=paused&type=Call+us+at+555",  # a key with a parameter outside its values
        "notice=bulk-retry&count=all+your+jobs",
        "notice=refused&code=PLEASE_VISIT_EVIL_EXAMPLE",
        "notice=sweeps-requested&sweeps=ghost,visit-evil.example",
    ],
)
async def test_anything_else_shows_nothing(api: httpx.AsyncClient, query: str) -> None:
    # a name of no digits: a random one ("op-d36a1555") could hold a word looked for
    page = await api.get(f"/admin?{query}", headers=operator_headers("op-notices"))
    assert page.status_code == 200
    assert 'id="notice"' not in page.text
    shown = re.sub(r'hx-get="[^"]*"', "", page.text)  # the page's own URL, to refresh itself
    for word in ("evil", "555", "session", "all+your", "PLEASE"):
        assert word not in shown, word


async def test_an_action_redirects_to_its_key(api: httpx.AsyncClient) -> None:
    headers = {**operator_headers(), "Sec-Fetch-Site": "same-origin"}
    done = await api.post("/admin/job-types/SCRAP_REFINE/pause", headers=headers)
    assert done.status_code == 303
    assert done.headers["location"] == "/admin?notice=paused&type=SCRAP_REFINE"
    assert notices.message({"notice": "paused", "type": "SCRAP_REFINE"}) == "SCRAP_REFINE paused"


async def test_a_refused_filter_redirects_to_the_refused_key(api: httpx.AsyncClient) -> None:
    """An error the console catches is shown by its code's fixed title, never its text."""
    bad = "createdFrom=2026-02-01T00:00:00Z&createdTo=2026-01-01T00:00:00Z"
    page = await api.get(f"/admin/jobs?{bad}", headers=operator_headers())
    assert page.status_code == 303, page.text
    assert page.headers["location"] == "/admin/jobs?notice=refused&code=VALIDATION_ERROR&error=1"
