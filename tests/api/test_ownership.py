"""Another user's job, scrap and card are 404 — indistinguishable from ids that do not
exist (docs/reference/job-rules.md §2.6, §4). Each test first checks that the owner does see the
resource."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx

from tests.api.support import (
    Sessions,
    assert_problem,
    embedding_at,
    insert_card,
    save_scrap,
    subject_of,
    user_id_of,
)


async def test_another_users_job_is_404(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    alice, bob = new_user(), new_user()
    saved = await save_scrap(api, alice)
    await save_scrap(api, bob)  # bob is a real, provisioned user

    for job_id in (saved["analysisJobId"], saved["refineJobId"]):
        own = await api.get(f"/async-jobs/{job_id}", headers=alice)
        assert own.status_code == 200, own.text
        assert own.json()["jobId"] == job_id

        other = await api.get(f"/async-jobs/{job_id}", headers=bob)
        body = assert_problem(other, 404, "NOT_FOUND")
        unknown = await api.get(f"/async-jobs/{uuid.uuid4()}", headers=bob)
        assert_problem(unknown, 404, "NOT_FOUND")
        assert "CARD_ANALYSIS" not in body["detail"] and "SCRAP_REFINE" not in body["detail"]


async def test_another_users_scrap_card_is_404(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    alice, bob = new_user(), new_user()
    saved = await save_scrap(api, alice)
    await save_scrap(api, bob)
    scrap_id = uuid.UUID(saved["scrapId"])

    # no card yet: 404 for the owner too
    assert_problem(await api.get(f"/cards/{scrap_id}", headers=alice), 404, "NOT_FOUND")

    alice_id = await user_id_of(sessions, subject_of(alice))
    card = await insert_card(sessions, alice_id, embedding_at(0.0, 1), scrap_id=scrap_id)

    own = await api.get(f"/cards/{scrap_id}", headers=alice)
    assert own.status_code == 200, own.text
    assert own.json()["cardId"] == str(card.card_id)
    assert own.json()["scrapId"] == str(scrap_id)

    assert_problem(await api.get(f"/cards/{scrap_id}", headers=bob), 404, "NOT_FOUND")
    # the card id is not a scrap id: looking it up as one finds nothing, even for alice
    assert_problem(await api.get(f"/cards/{card.card_id}", headers=alice), 404, "NOT_FOUND")


async def test_another_users_similar_cards_is_404(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    alice, bob = new_user(), new_user()
    await save_scrap(api, alice)
    await save_scrap(api, bob)
    alice_id = await user_id_of(sessions, subject_of(alice))
    bob_id = await user_id_of(sessions, subject_of(bob))
    card = await insert_card(sessions, alice_id, embedding_at(0.0, 1))
    # bob even has a card identical to alice's: still no access to hers
    await insert_card(sessions, bob_id, embedding_at(0.0, 1))

    own = await api.get(f"/cards/{card.card_id}/similar-cards", headers=alice)
    assert own.status_code == 200, own.text

    for query in ("", "?limit=5"):
        other = await api.get(f"/cards/{card.card_id}/similar-cards{query}", headers=bob)
        assert_problem(other, 404, "NOT_FOUND")
    unknown = await api.get(f"/cards/{uuid.uuid4()}/similar-cards", headers=alice)
    assert_problem(unknown, 404, "NOT_FOUND")
