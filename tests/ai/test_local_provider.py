"""The offline provider: deterministic, and its embeddings put similar texts near each other."""

from __future__ import annotations

import datetime
import math

import pytest

from san_ai_worker.ai import CardInput, LocalProvider, StarInput
from san_common.errors import PermanentJobError


def cosine_distance(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return 1 - dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


@pytest.fixture
def local() -> LocalProvider:
    return LocalProvider()


CARDS = [
    CardInput(
        "Asyncio gather",
        "asyncio.gather runs coroutines concurrently. It returns results in order.",
        ["asyncio", "python"],
        "programming",
    ),
    CardInput("B-tree indexes", "A B-tree index speeds up lookups in PostgreSQL.", ["sql"], None),
    CardInput("파이썬 제너레이터", "제너레이터는 값을 하나씩 만든다.", ["파이썬"], "programming"),
]


async def test_embeddings_are_deterministic_unit_vectors(local: LocalProvider) -> None:
    text = "Python asyncio runs coroutines on an event loop"

    first = await local.embed(text)
    second = await LocalProvider().embed(text)

    assert first == second
    assert len(first) == 1536
    assert math.isclose(math.sqrt(sum(v * v for v in first)), 1.0)


async def test_embedding_hash_is_stable_across_processes(local: LocalProvider) -> None:
    # Pinned so that a switch to Python's salted hash() (or another hash) is noticed:
    # stored embeddings would stop matching new ones.
    vector = await local.embed("python")

    assert [i for i, v in enumerate(vector) if v] == [625]
    assert vector[625] == 1.0


async def test_empty_text_embeds_to_a_fixed_unit_vector(local: LocalProvider) -> None:
    empty = await local.embed("")
    stopwords_only = await local.embed("the and of")

    assert empty == stopwords_only
    assert empty[0] == 1.0 and sum(abs(v) for v in empty) == 1.0


@pytest.mark.parametrize(
    ("text", "near", "far"),
    [
        (
            "Python asyncio gather runs coroutines concurrently and collects their results.",
            "With asyncio gather, Python runs many coroutines concurrently and collects results.",
            "Kubernetes schedules containers onto nodes and restarts failed pods.",
        ),
        (
            "파이썬 비동기 프로그래밍은 이벤트 루프에서 코루틴을 실행한다.",
            "파이썬의 비동기 프로그래밍에서는 이벤트 루프가 여러 코루틴을 함께 실행한다.",
            "데이터베이스 인덱스는 조회 속도를 높이는 자료 구조다.",
        ),
    ],
)
async def test_similar_texts_are_near_and_unrelated_far(
    local: LocalProvider, text: str, near: str, far: str
) -> None:
    base = await local.embed(text)

    assert cosine_distance(base, await local.embed(near)) < 0.5
    assert cosine_distance(base, await local.embed(far)) > 0.5


async def test_analyze_card(local: LocalProvider) -> None:
    content = (
        "Asyncio in Python\n"
        "Asyncio runs coroutines on an event loop. Asyncio gather waits for many coroutines. "
        "Tasks wrap coroutines. This fourth sentence is not in the summary."
    )

    card = await local.analyze_card(content)

    assert card.title == "Asyncio in Python"
    assert card.summary == (
        "Asyncio runs coroutines on an event loop. Asyncio gather waits for many coroutines. "
        "Tasks wrap coroutines."
    )
    assert card.tags[:2] == ["asyncio", "coroutines"]
    assert len(card.tags) <= 5
    assert card.category == "programming"
    assert card == await local.analyze_card(content)


async def test_analyze_card_limits_and_fallbacks(local: LocalProvider) -> None:
    long_sentence = "word " * 200

    card = await local.analyze_card(long_sentence + ". Another sentence about gardens.")

    assert len(card.title) <= 80
    assert len(card.summary) <= 400
    assert card.category == "general"
    with pytest.raises(PermanentJobError):
        await local.analyze_card("  \n ")


async def test_analyze_card_in_korean(local: LocalProvider) -> None:
    card = await local.analyze_card(
        "데이터베이스 인덱스는 조회를 빠르게 한다. 인덱스가 많으면 쓰기가 느려진다."
    )

    assert card.title == "데이터베이스 인덱스는 조회를 빠르게 한다."
    assert card.tags[0] == "인덱스"
    assert card.category == "database"


async def test_refine_scrap_normalizes_whitespace(local: LocalProvider) -> None:
    messy = "  Title   here  \r\n\r\n\r\n\r\nSome\u00a0 text\t with   gaps.   \n    code  block\n\n"

    refined = await local.refine_scrap(messy)

    assert refined.refinedContent == "Title here\n\nSome text with gaps.\n    code block"


async def test_til_is_markdown_mentioning_every_card(local: LocalProvider) -> None:
    til = await local.write_til(datetime.date(2026, 12, 2), CARDS)

    assert til.title == "TIL 2026-12-02: Asyncio gather"
    markdown = til.tilMarkdown
    assert markdown.startswith("# TIL 2026-12-02\n")
    for card in CARDS:
        assert f"## {card.title}" in markdown
        assert card.summary in markdown
    assert "#asyncio #python" in markdown


async def test_til_of_a_day_without_cards(local: LocalProvider) -> None:
    til = await local.write_til(datetime.date(2026, 12, 2), [])

    assert til.title == "TIL 2026-12-02"
    assert til.tilMarkdown.startswith("# TIL 2026-12-02")


@pytest.mark.parametrize("types", [["OX"], ["SHORT_ANSWER"], ["OX", "SHORT_ANSWER"]])
async def test_quizzes_per_requested_type(local: LocalProvider, types: list[str]) -> None:
    quiz_set = await local.make_quizzes(CARDS, types)

    assert len(quiz_set.quizzes) == len(CARDS) * len(types)
    for quiz_type in types:
        assert sum(quiz.type == quiz_type for quiz in quiz_set.quizzes) == len(CARDS)


async def test_quiz_content(local: LocalProvider) -> None:
    ox, short = (await local.make_quizzes(CARDS[:1], ["OX", "SHORT_ANSWER"])).quizzes

    assert ox.answer == "O"
    assert "asyncio.gather runs coroutines concurrently." in ox.question
    assert short.answer == "asyncio"
    assert short.question == (
        "Fill in the blank: ____.gather runs coroutines concurrently. It returns results in order."
    )


async def test_quizzes_are_capped_at_ten(local: LocalProvider) -> None:
    quiz_set = await local.make_quizzes(CARDS * 4, ["OX", "SHORT_ANSWER"])

    assert len(quiz_set.quizzes) == 10
    assert {quiz.type for quiz in quiz_set.quizzes} == {"OX", "SHORT_ANSWER"}


async def test_unknown_quiz_type_is_rejected(local: LocalProvider) -> None:
    with pytest.raises(PermanentJobError):
        await local.make_quizzes(CARDS, ["OX", "ESSAY"])


def _star(
    name: str, description: str | None, topics: list[str], language: str | None = None
) -> StarInput:
    return StarInput(name, description, topics, language, f"https://github.com/{name}")


async def test_stars_are_ranked_by_overlap_with_interests(local: LocalProvider) -> None:
    stars = [
        _star("psf/requests", "HTTP for humans", ["http"], "Python"),
        _star("tiangolo/fastapi", "FastAPI web framework", ["python", "asyncio", "web"]),
        _star("gohugoio/hugo", "Static site generator", ["go"], "Go"),
        _star("aio-libs/aiohttp", "Async HTTP client/server for asyncio", [], "Python"),
    ]

    result = await local.recommend_stars(stars, ["python", "asyncio", "web", "programming"])

    ranked = [(rec.repoFullName, rec.score) for rec in result.recommendations]
    assert ranked == [
        ("tiangolo/fastapi", 0.75),
        ("aio-libs/aiohttp", 0.5),
        ("psf/requests", 0.25),
    ]
    assert result.recommendations[0].reason.endswith("asyncio, python, web")


async def test_no_recommendations_when_nothing_matches(local: LocalProvider) -> None:
    stars = [_star("gohugoio/hugo", "Static site generator", ["go"], "Go")]

    result = await local.recommend_stars(stars, ["database", "sql"])

    assert result.recommendations == []


async def test_at_most_ten_recommendations(local: LocalProvider) -> None:
    stars = [_star(f"owner/python-{i:02}", None, []) for i in range(15)]

    result = await local.recommend_stars(stars, ["python"])

    assert [r.repoFullName for r in result.recommendations] == [
        f"owner/python-{i:02}" for i in range(10)
    ]
    assert all(0 <= r.score <= 1 for r in result.recommendations)
