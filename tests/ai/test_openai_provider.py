"""The OpenAI-compatible provider against the fake AI server on loopback
(docs/reference/job-rules.md §8)."""

from __future__ import annotations

import datetime
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from san_ai_worker.ai import (
    AiProvider,
    CardInput,
    LocalProvider,
    OpenAICompatibleProvider,
    StarInput,
    build_provider,
)
from san_common.errors import JobFailure, PermanentJobError, TransientJobError, cause_chain
from tests.fakes.fake_ai import FakeAiServer

API_KEY = "sk-test-do-not-leak-0123456789"
TIMEOUT = 0.5
CARDS = [
    CardInput("Asyncio gather", "gather runs coroutines concurrently.", ["asyncio"], "programming"),
    CardInput("B-tree indexes", "An index speeds up lookups.", ["sql", "index"], None),
]
STARS = [
    StarInput("python/cpython", "The Python language", ["python"], "Python", "https://x/1"),
    StarInput("tiangolo/fastapi", "Web framework", ["web", "python"], "Python", "https://x/2"),
]


@pytest.fixture
def ai() -> Iterator[FakeAiServer]:
    with FakeAiServer() as server:
        yield server


@pytest.fixture
async def provider(ai: FakeAiServer) -> AsyncIterator[AiProvider]:
    provider = build_provider(
        "openai",
        base_url=ai.base_url,
        api_key=API_KEY,
        chat_model="chat-model",
        embedding_model="embedding-model",
        timeout_seconds=TIMEOUT,
    )
    yield provider
    await provider.aclose()


def _last_chat(ai: FakeAiServer) -> dict[str, Any]:
    path, body = ai.requests[-1]
    assert path == "/v1/chat/completions"
    return body


def _user_message(body: dict[str, Any]) -> str:
    roles = [message["role"] for message in body["messages"]]
    assert roles == ["system", "user"]
    return str(body["messages"][1]["content"])


async def test_analyze_card_request_follows_the_contract(
    ai: FakeAiServer, provider: AiProvider
) -> None:
    analysis = await provider.analyze_card("Asyncio notes\nPython asyncio gathers coroutines.")

    assert analysis.title == "Asyncio notes"
    assert analysis.summary
    assert all(tag == tag.lower() for tag in analysis.tags)
    body = _last_chat(ai)
    assert body["model"] == "chat-model"
    assert _user_message(body) == "Asyncio notes\nPython asyncio gathers coroutines."
    response_format = body["response_format"]
    assert response_format["type"] == "json_schema"
    schema_spec = response_format["json_schema"]
    assert schema_spec["name"] == "card_analysis"
    assert schema_spec["strict"] is True
    schema = schema_spec["schema"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"title", "summary", "tags", "category"}
    assert schema["properties"]["tags"]["type"] == "array"
    assert ai.request_headers[-1]["authorization"] == f"Bearer {API_KEY}"


async def test_each_call_uses_its_schema_name(ai: FakeAiServer, provider: AiProvider) -> None:
    refined = await provider.refine_scrap("  messy \n\n text ")
    til = await provider.write_til(datetime.date(2026, 12, 2), CARDS)
    quizzes = await provider.make_quizzes(CARDS, ["OX"])
    recommendations = await provider.recommend_stars(STARS, ["python", "web"])

    names = [body["response_format"]["json_schema"]["name"] for _, body in ai.requests]
    assert names == ["scrap_refine", "til", "recall_quiz", "star_recommendation"]
    assert refined.refinedContent == "messy text"
    assert til.title == "TIL 2026-12-02"
    assert all(card.title in til.tilMarkdown for card in CARDS)
    assert {quiz.type for quiz in quizzes.quizzes} == {"OX"}
    assert [r.repoFullName for r in recommendations.recommendations] == [
        "python/cpython",
        "tiangolo/fastapi",
    ]


async def test_prompts_carry_the_parseable_lines(ai: FakeAiServer, provider: AiProvider) -> None:
    await provider.write_til(datetime.date(2026, 12, 2), CARDS)
    til_prompt = _user_message(_last_chat(ai))
    await provider.make_quizzes(CARDS, ["SHORT_ANSWER", "OX"])
    quiz_prompt = _user_message(_last_chat(ai))
    await provider.recommend_stars(STARS, ["python"])
    star_prompt = _user_message(_last_chat(ai))

    assert "date: 2026-12-02" in til_prompt.splitlines()
    assert "title: B-tree indexes" in til_prompt.splitlines()
    assert "quiz_types: SHORT_ANSWER,OX" in quiz_prompt.splitlines()
    assert {"repo: python/cpython", "repo: tiangolo/fastapi"} <= set(star_prompt.splitlines())
    assert "interests: python" in star_prompt.splitlines()


async def test_quizzes_cover_every_requested_type(provider: AiProvider) -> None:
    quiz_set = await provider.make_quizzes(CARDS, ["OX", "SHORT_ANSWER"])

    assert {quiz.type for quiz in quiz_set.quizzes} == {"OX", "SHORT_ANSWER"}


async def test_quiz_of_an_unrequested_type_fails_the_job(
    ai: FakeAiServer, provider: AiProvider
) -> None:
    ai.chat_override = lambda name, body: {
        "quizzes": [{"type": "SHORT_ANSWER", "question": "q?", "answer": "a", "explanation": ""}]
    }

    with pytest.raises(PermanentJobError, match="quiz type SHORT_ANSWER, requested OX"):
        await provider.make_quizzes(CARDS, ["OX"])


async def test_unknown_quiz_type_is_bad_job_data(ai: FakeAiServer, provider: AiProvider) -> None:
    with pytest.raises(PermanentJobError, match="quiz types"):
        await provider.make_quizzes(CARDS, ["ESSAY"])
    assert ai.requests == []


async def test_til_without_markdown_is_a_failed_attempt(
    ai: FakeAiServer, provider: AiProvider
) -> None:
    ai.chat_override = lambda name, body: {"title": "TIL"}

    with pytest.raises(TransientJobError) as caught:
        await provider.write_til(datetime.date(2026, 12, 2), CARDS)

    assert str(caught.value) == "AI answer for til misses field 'tilMarkdown'"
    assert caught.value.__cause__ is not None


async def test_recommendations_keep_only_starred_repositories(
    ai: FakeAiServer, provider: AiProvider
) -> None:
    def answer(name: str, body: dict[str, Any]) -> dict[str, Any]:
        recs = [("PYTHON/CPython", 0.9), ("made/up", 0.8), ("python/cpython", 0.1)]
        return {
            "recommendations": [
                {"repoFullName": repo, "reason": "useful", "score": score} for repo, score in recs
            ]
        }

    ai.chat_override = answer

    result = await provider.recommend_stars(STARS, ["python"])

    assert [(r.repoFullName, r.score) for r in result.recommendations] == [("python/cpython", 0.9)]


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        ("http_500", TransientJobError, "AI server answered 500 on /chat/completions"),
        ("http_429", TransientJobError, "AI server answered 429 on /chat/completions"),
        ("http_400", PermanentJobError, "AI server answered 400 on /chat/completions"),
        ("timeout", TransientJobError, "AI server timed out on /chat/completions"),
        ("invalid_json", TransientJobError, "AI answer for card_analysis is not valid JSON"),
        ("missing_field", TransientJobError, "AI answer for card_analysis misses field 'title'"),
    ],
)
async def test_chat_faults_are_classified(
    ai: FakeAiServer,
    provider: AiProvider,
    fault: Any,
    error: type[JobFailure],
    message: str,
) -> None:
    ai.fault = fault

    with pytest.raises(JobFailure) as caught:
        await provider.analyze_card("some text")

    assert type(caught.value) is error
    assert str(caught.value).startswith(message)
    chain = cause_chain(caught.value)
    assert chain.startswith(message)
    if fault in ("timeout", "invalid_json", "missing_field"):
        assert caught.value.__cause__ is not None, "the original exception is chained"
        assert chain != message


async def test_429_honours_retry_after(ai: FakeAiServer, provider: AiProvider) -> None:
    ai.retry_after = "12"
    ai.set_fault("http_429")

    with pytest.raises(TransientJobError) as caught:
        await provider.embed("text")

    assert caught.value.retry_after == 12.0


async def test_500_without_retry_after_leaves_backoff_to_the_runtime(
    ai: FakeAiServer, provider: AiProvider
) -> None:
    ai.set_fault("http_500")

    with pytest.raises(TransientJobError) as caught:
        await provider.embed("text")

    assert caught.value.retry_after is None
    assert str(caught.value).startswith("AI server answered 500 on /embeddings")


async def test_fault_for_the_next_requests_only(ai: FakeAiServer, provider: AiProvider) -> None:
    ai.set_fault("http_500", times=2)

    for _ in range(2):
        with pytest.raises(TransientJobError):
            await provider.refine_scrap("text")
    refined = await provider.refine_scrap("text")

    assert refined.refinedContent == "text"
    assert ai.fault is None


async def test_unreachable_server_is_transient() -> None:
    with FakeAiServer() as ai:
        base_url = ai.base_url  # closed when the block ends: nothing listens there any more
    provider = build_provider(
        "openai",
        base_url=base_url,
        api_key=None,
        chat_model="m",
        embedding_model="e",
        timeout_seconds=TIMEOUT,
    )
    try:
        with pytest.raises(TransientJobError, match="AI server unreachable on /embeddings") as c:
            await provider.embed("text")
    finally:
        await provider.aclose()
    assert c.value.__cause__ is not None


async def test_api_key_is_sent_but_never_in_error_messages(
    ai: FakeAiServer, provider: AiProvider
) -> None:
    ai.set_fault("http_400")  # the fake echoes the Authorization header it saw

    with pytest.raises(PermanentJobError) as caught:
        await provider.analyze_card("text")

    assert ai.request_headers[-1]["authorization"] == f"Bearer {API_KEY}"
    assert "invalid request" in str(caught.value)
    error: BaseException | None = caught.value
    while error is not None:
        assert API_KEY not in str(error) and API_KEY not in repr(error)
        error = error.__cause__ or error.__context__
    assert API_KEY not in cause_chain(caught.value)


async def test_no_authorization_header_without_a_key(ai: FakeAiServer) -> None:
    provider = build_provider(
        "openai",
        base_url=ai.base_url,
        api_key="",
        chat_model="m",
        embedding_model="e",
        timeout_seconds=TIMEOUT,
    )
    try:
        await provider.embed("text")
    finally:
        await provider.aclose()

    assert "authorization" not in ai.request_headers[-1]


async def test_embedding_request_and_answer(ai: FakeAiServer, provider: AiProvider) -> None:
    vector = await provider.embed("hello world")

    assert ai.requests[-1] == (
        "/v1/embeddings",
        {"model": "embedding-model", "input": "hello world", "dimensions": 1536},
    )
    assert vector == FakeAiServer.embedding_for("hello world", 1536)


async def test_shorter_embeddings_fail_the_job(ai: FakeAiServer, provider: AiProvider) -> None:
    """No zero-padding: another model's vector is not comparable with the stored ones."""
    ai.embedding_dimensions = 768

    with pytest.raises(PermanentJobError, match=r"^embedding has 768 dimensions, expected 1536"):
        await provider.embed("hello world")


async def test_longer_embeddings_fail_the_job(ai: FakeAiServer, provider: AiProvider) -> None:
    ai.fault = "wrong_dimension"

    with pytest.raises(PermanentJobError, match=r"^embedding has 2048 dimensions, expected 1536"):
        await provider.embed("hello world")


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("invalid_json", "AI server answered /embeddings with a body that is not JSON"),
        ("missing_field", "AI answer for embeddings misses data[0].embedding"),
        ("timeout", "AI server timed out on /embeddings"),
    ],
)
async def test_embedding_faults_are_transient(
    ai: FakeAiServer, provider: AiProvider, fault: Any, message: str
) -> None:
    ai.fault = fault

    with pytest.raises(TransientJobError, match=f"^{re.escape(message)}$") as caught:
        await provider.embed("hello world")

    assert caught.value.__cause__ is not None


@pytest.mark.parametrize(
    ("embedding", "error", "message"),
    [
        ([], PermanentJobError, "embedding has 0 dimensions, expected 1536"),
        ([0.1, "x"], TransientJobError, "not a list of numbers"),
        ([0.1, True], TransientJobError, "not a list of numbers"),
        ("0.1,0.2", TransientJobError, "not a list of numbers"),
    ],
)
async def test_malformed_embeddings_fail(
    embedding: Any, error: type[JobFailure], message: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"embedding": embedding}]})

    provider = build_provider(
        "openai",
        base_url="http://ai.test/v1",
        api_key=None,
        chat_model="m",
        embedding_model="e",
        timeout_seconds=TIMEOUT,
        transport=httpx.MockTransport(handler),
    )
    try:
        with pytest.raises(error, match=message):
            await provider.embed("text")
    finally:
        await provider.aclose()


async def test_refusal_fails_the_job() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        message = {"role": "assistant", "content": None, "refusal": "I cannot help with that."}
        return httpx.Response(200, json={"choices": [{"message": message}]})

    provider = build_provider(
        "openai",
        base_url="http://ai.test/v1",
        api_key=None,
        chat_model="m",
        embedding_model="e",
        timeout_seconds=TIMEOUT,
        transport=httpx.MockTransport(handler),
    )
    try:
        with pytest.raises(PermanentJobError, match="AI refused card_analysis: I cannot help"):
            await provider.analyze_card("text")
    finally:
        await provider.aclose()


async def test_build_provider_picks_the_implementation() -> None:
    local = build_provider("local")
    remote = build_provider("openai", base_url="http://ai.test/v1")
    try:
        assert isinstance(local, LocalProvider)
        assert isinstance(remote, OpenAICompatibleProvider)
        with pytest.raises(ValueError, match="unknown AI provider 'gpt'"):
            build_provider("gpt")
    finally:
        await local.aclose()
        await remote.aclose()
