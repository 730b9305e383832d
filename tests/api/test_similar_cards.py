"""GET /cards/{cardId}/similar-cards (docs/reference/job-rules.md §3.1): the user's cards within
cosine distance
0.5, nearest first; if none, the K nearest (`fallback: true`). Never the card itself, never
another user's card. Embeddings are crafted so each card's distance from e0 is known."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.api.support import (
    InsertedCard,
    Sessions,
    embedding_at,
    insert_card,
    save_scrap,
    subject_of,
    user_id_of,
)


@dataclass(frozen=True)
class Library:
    headers: dict[str, str]
    query: InsertedCard
    by_distance: dict[float, InsertedCard]
    strangers: list[InsertedCard]


async def _library(
    api: httpx.AsyncClient,
    sessions: Sessions,
    new_user: Callable[[], dict[str, str]],
    distances: list[float],
) -> Library:
    """A user whose query card is e0 and whose other cards lie at `distances` from it; and
    another user with cards at distance 0 and 0.01 from it."""
    headers, stranger = new_user(), new_user()
    await save_scrap(api, headers)
    await save_scrap(api, stranger)
    user_id = await user_id_of(sessions, subject_of(headers))
    stranger_id = await user_id_of(sessions, subject_of(stranger))
    query = await insert_card(sessions, user_id, embedding_at(0.0, 1), title="query")
    by_distance = {
        d: await insert_card(sessions, user_id, embedding_at(d, 2 + i), title=f"d={d}")
        for i, d in enumerate(distances)
    }
    strangers = [
        await insert_card(sessions, stranger_id, embedding_at(d, 1), title=f"stranger {d}")
        for d in (0.0, 0.01)
    ]
    return Library(headers, query, by_distance, strangers)


async def _similar(api: httpx.AsyncClient, library: Library, query: str = "") -> dict[str, Any]:
    response = await api.get(
        f"/cards/{library.query.card_id}/similar-cards{query}", headers=library.headers
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["cardId"] == str(library.query.card_id)
    assert body["threshold"] == 0.5
    returned = {card["cardId"] for card in body["cards"]}
    assert str(library.query.card_id) not in returned
    assert returned.isdisjoint(str(card.card_id) for card in library.strangers)
    distances = [card["distance"] for card in body["cards"]]
    assert distances == sorted(distances)
    return body


def _expect(body: dict[str, Any], library: Library, distances: list[float]) -> None:
    assert [card["cardId"] for card in body["cards"]] == [
        str(library.by_distance[d].card_id) for d in distances
    ]
    assert [card["distance"] for card in body["cards"]] == pytest.approx(distances, abs=1e-5)
    for card in body["cards"]:
        expected = next(c for c in library.by_distance.values() if str(c.card_id) == card["cardId"])
        assert card["scrapId"] == str(expected.scrap_id)


async def test_cards_within_the_threshold_nearest_first(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    library = await _library(api, sessions, new_user, [0.9, 0.3, 0.51, 0.05, 1.6, 0.45, 0.49])
    body = await _similar(api, library)
    assert body["fallback"] is False
    _expect(body, library, [0.05, 0.3, 0.45, 0.49])


async def test_limit_caps_the_cards_within_the_threshold(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    library = await _library(api, sessions, new_user, [0.4, 0.1, 0.2, 0.7])
    body = await _similar(api, library, "?limit=2")
    assert body["fallback"] is False
    _expect(body, library, [0.1, 0.2])


async def test_none_within_the_threshold_falls_back_to_the_k_nearest(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    library = await _library(api, sessions, new_user, [1.0, 0.6, 1.9, 0.75])
    body = await _similar(api, library)
    assert body["fallback"] is True
    _expect(body, library, [0.6, 0.75, 1.0, 1.9])

    limited = await _similar(api, library, "?limit=2")
    assert limited["fallback"] is True
    _expect(limited, library, [0.6, 0.75])


async def test_default_k_bounds_the_fallback(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    """Default K is 10 (settings): 12 far cards give the 10 nearest of them."""
    distances = [round(0.6 + 0.1 * i, 2) for i in range(12)]
    library = await _library(api, sessions, new_user, distances)
    body = await _similar(api, library)
    assert body["fallback"] is True
    _expect(body, library, distances[:10])


async def test_a_lone_card_has_no_similar_cards(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    """Only another user's identical card exists: the list is empty, not a fallback."""
    library = await _library(api, sessions, new_user, [])
    body = await _similar(api, library)
    assert body == {
        "cardId": str(library.query.card_id),
        "threshold": 0.5,
        "fallback": False,
        "cards": [],
    }


async def test_a_card_is_not_its_own_neighbour_even_with_an_identical_twin(
    api: httpx.AsyncClient, sessions: Sessions, new_user: Callable[[], dict[str, str]]
) -> None:
    library = await _library(api, sessions, new_user, [0.0])
    body = await _similar(api, library)
    assert body["fallback"] is False
    _expect(body, library, [0.0])
    assert uuid.UUID(body["cards"][0]["cardId"]) != library.query.card_id
