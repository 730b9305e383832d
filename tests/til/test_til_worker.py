"""TIL_GENERATION and RECALL_QUIZ_GENERATION in the ai-worker (docs/reference/job-rules.md §3.2,
§3.4): what is stored on success, and that a failure leaves the job and its domain row FAILED with
the cause chain and nothing half-written."""

from __future__ import annotations

import uuid
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from san_common.models import (
    DailySummary,
    RecallQuiz,
    RecallQuizGeneration,
    daily_summary_cards,
)
from san_common.til import QuizStarted, TilStarted, start_quiz_generation, start_til_generation
from tests.api.support import Sessions
from tests.til.conftest import Worker
from tests.til.support import TestUser, add_card, at_noon, days_ago, make_user
from tests.waiting import settled_job

pytestmark = pytest.mark.rabbit


async def _start_til(sessions: Sessions, user: TestUser, day: date) -> TilStarted:
    async with sessions() as session, session.begin():
        return await start_til_generation(session, user_id=user.user_id, target_date=day)


async def _start_quizzes(
    sessions: Sessions, user: TestUser, day: date, types: list[str]
) -> QuizStarted:
    async with sessions() as session, session.begin():
        return await start_quiz_generation(
            session, user_id=user.user_id, target_date=day, quiz_types=types
        )


async def _summary(
    sessions: Sessions, summary_id: uuid.UUID
) -> tuple[DailySummary, set[uuid.UUID]]:
    async with sessions() as session:
        summary = await session.get(DailySummary, summary_id)
        sources = await session.scalars(
            select(daily_summary_cards.c.card_id).where(
                daily_summary_cards.c.summary_id == summary_id
            )
        )
        assert summary is not None
        return summary, set(sources)


async def _quizzes(sessions: Sessions, generation_id: uuid.UUID) -> list[RecallQuiz]:
    async with sessions() as session:
        result = await session.scalars(
            select(RecallQuiz)
            .where(RecallQuiz.generation_id == generation_id)
            .order_by(RecallQuiz.position)
        )
        return list(result)


async def _generation(sessions: Sessions, generation_id: uuid.UUID) -> RecallQuizGeneration:
    async with sessions() as session:
        generation = await session.get(RecallQuizGeneration, generation_id)
    assert generation is not None
    return generation


def _seoul(day: date, hour: int, minute: int) -> datetime:
    return datetime.combine(day, time(hour, minute), tzinfo=ZoneInfo("Asia/Seoul"))


def _til_prompts(worker: Worker, marker: str) -> list[str]:
    return [
        message["content"]
        for path, body in worker.ai.requests
        if path.endswith("/chat/completions")
        and body["response_format"]["json_schema"]["name"] == "til"
        for message in body["messages"]
        if message["role"] == "user" and marker in message["content"]
    ]


async def test_til_is_written_from_the_users_day_and_regenerating_replaces_it(
    worker: Worker,
) -> None:
    sessions, marker = worker.sessions, uuid.uuid4().hex[:8]
    day = days_ago(3)
    user, stranger = await make_user(sessions, "Asia/Seoul"), await make_user(sessions)
    # The user's day runs from 00:00 to 24:00 in Seoul (15:00Z the day before to 15:00).
    first = await add_card(sessions, user, _seoul(day, 0, 10), title=f"Rust ownership {marker}")
    second = await add_card(
        sessions,
        user,
        _seoul(day, 23, 50),
        title=f"Postgres MVCC {marker}",
        tags=["mvcc", "postgres"],
        category="database",
    )
    await add_card(sessions, user, _seoul(day - timedelta(days=1), 23, 50), title="Day before")
    await add_card(sessions, user, _seoul(day + timedelta(days=1), 0, 10), title="Day after")
    await add_card(sessions, stranger, _seoul(day, 12, 0), title="Not mine")

    started = await _start_til(sessions, user, day)
    job = await settled_job(sessions, started.job_id)
    assert job.status == "COMPLETED", job.error_message
    summary, sources = await _summary(sessions, started.summary_id)
    assert (summary.status, summary.error_message) == ("COMPLETED", None)
    assert summary.title == f"TIL {day}"
    assert summary.til_markdown is not None and summary.completed_at is not None
    for title in (f"Rust ownership {marker}", f"Postgres MVCC {marker}"):
        assert title in summary.til_markdown
    for title in ("Day before", "Day after", "Not mine"):
        assert title not in summary.til_markdown
    assert summary.embedding is not None and len(summary.embedding) == 1536
    assert sources == {first, second}
    (prompt,) = _til_prompts(worker, marker)
    assert f"date: {day}" in prompt
    assert "tags: mvcc, postgres" in prompt and "category: database" in prompt

    # Regenerate after one more card: same row, new document, new set of source cards.
    third = await add_card(sessions, user, _seoul(day, 18, 0), title=f"HNSW {marker}")
    worker.ai.chat_override = lambda name, body: {
        "title": "Second take",
        "tilMarkdown": "# Second take\n\nRust, MVCC and HNSW.\n",
    }
    again = await _start_til(sessions, user, day)
    assert again.summary_id == started.summary_id
    assert (await settled_job(sessions, again.job_id)).status == "COMPLETED"
    summary, sources = await _summary(sessions, started.summary_id)
    assert (summary.status, summary.title) == ("COMPLETED", "Second take")
    assert summary.til_markdown == "# Second take\n\nRust, MVCC and HNSW."
    assert sources == {first, second, third}


async def test_til_answer_without_markdown_fails_job_and_summary_and_writes_nothing(
    worker: Worker,
) -> None:
    sessions, day = worker.sessions, days_ago(2)
    user = await make_user(sessions)
    card = await add_card(sessions, user, at_noon(day), title="Event loops")
    worker.ai.chat_override = lambda name, body: {"title": "A title and nothing else"}

    started = await _start_til(sessions, user, day)
    job = await settled_job(sessions, started.job_id)
    assert job.status == "FAILED"
    # outer: cause: root cause — the retry gave up, because the answer lacks the field
    assert (job.error_message or "").startswith(
        "TIL_GENERATION failed: gave up after 2 tries: AI answer for til misses field 'tilMarkdown'"
    ), job.error_message
    summary, sources = await _summary(sessions, started.summary_id)
    # the row its owner reads carries the sanitized summary; the chain stays on the job
    assert (summary.status, summary.error_message) == ("FAILED", job.error_summary)
    assert "tilMarkdown" not in (summary.error_message or "")
    assert (summary.title, summary.til_markdown, summary.embedding) == (None, None, None)
    assert sources == set()

    # A later success completes it; a failed regeneration after that keeps the document.
    worker.ai.chat_override = None
    done = await _start_til(sessions, user, day)
    assert (await settled_job(sessions, done.job_id)).status == "COMPLETED"
    completed, _ = await _summary(sessions, started.summary_id)
    worker.ai.chat_override = lambda name, body: {"title": "Broken again"}
    failed = await _start_til(sessions, user, day)
    failed_job = await settled_job(sessions, failed.job_id)
    assert failed_job.status == "FAILED" and failed_job.error_summary
    summary, sources = await _summary(sessions, started.summary_id)
    assert summary.status == "FAILED" and summary.error_message == failed_job.error_summary
    assert (summary.title, summary.til_markdown) == (completed.title, completed.til_markdown)
    assert sources == {card}


async def test_quizzes_cover_every_requested_type_in_order(worker: Worker) -> None:
    sessions, day = worker.sessions, days_ago(2)
    user = await make_user(sessions)
    for title in ("Borrow checker", "Lifetimes"):
        await add_card(sessions, user, at_noon(day), title=title)

    both = await _start_quizzes(sessions, user, day, ["OX", "SHORT_ANSWER"])
    short = await _start_quizzes(sessions, user, day, ["SHORT_ANSWER"])
    for started, types in ((both, {"OX", "SHORT_ANSWER"}), (short, {"SHORT_ANSWER"})):
        job = await settled_job(sessions, started.job_id)
        assert job.status == "COMPLETED", job.error_message
        generation = await _generation(sessions, started.generation_id)
        assert (generation.status, generation.completed_at is not None) == ("COMPLETED", True)
        quizzes = await _quizzes(sessions, started.generation_id)
        assert {q.quiz_type for q in quizzes} == types
        assert [q.position for q in quizzes] == list(range(1, len(quizzes) + 1))
        assert all(q.question and q.answer for q in quizzes)


def _quiz_answer(types: list[str]) -> dict[str, Any]:
    return {
        "quizzes": [
            {"type": t, "question": f"{t} question", "answer": "O", "explanation": "why"}
            for t in types
        ]
    }


@pytest.mark.parametrize(
    ("requested", "answered", "cause"),
    [
        (["OX"], ["OX", "SHORT_ANSWER"], "quiz type SHORT_ANSWER, requested OX"),
        (["OX", "SHORT_ANSWER"], ["OX", "OX"], "AI quizzes have no SHORT_ANSWER quiz"),
        (["OX"], [], "AI quizzes have no OX quiz"),
    ],
)
async def test_quizzes_of_the_wrong_types_fail_the_generation_and_store_none(
    worker: Worker, requested: list[str], answered: list[str], cause: str
) -> None:
    sessions, day = worker.sessions, days_ago(2)
    user = await make_user(sessions)
    await add_card(sessions, user, at_noon(day))
    worker.ai.chat_override = lambda name, body: _quiz_answer(answered)

    started = await _start_quizzes(sessions, user, day, requested)
    job = await settled_job(sessions, started.job_id)
    assert job.status == "FAILED"
    assert job.error_message is not None
    assert job.error_message.startswith("RECALL_QUIZ_GENERATION failed: ")
    assert cause in job.error_message
    assert "gave up" not in job.error_message  # permanent: not retried
    generation = await _generation(sessions, started.generation_id)
    assert (generation.status, generation.error_message) == ("FAILED", job.error_summary)
    assert await _quizzes(sessions, started.generation_id) == []


async def test_a_day_without_cards_at_processing_time_fails_both_jobs(worker: Worker) -> None:
    """Registered directly (the API would refuse), as the cards could also vanish between
    the request and the processing."""
    sessions, day = worker.sessions, days_ago(2)
    user = await make_user(sessions)
    await add_card(sessions, user, at_noon(day + timedelta(days=1)))
    ai_calls = len(worker.ai.requests)
    til = await _start_til(sessions, user, day)
    quizzes = await _start_quizzes(sessions, user, day, ["OX"])
    for job_id in (til.job_id, quizzes.job_id):
        job = await settled_job(sessions, job_id)
        assert job.status == "FAILED"
        assert f"the user has no knowledge cards on {day} (time zone UTC)" in (
            job.error_message or ""
        )
    summary, _ = await _summary(sessions, til.summary_id)
    assert summary.status == "FAILED" and summary.til_markdown is None
    assert (await _generation(sessions, quizzes.generation_id)).status == "FAILED"
    assert len(worker.ai.requests) == ai_calls  # failed in `load`, before any AI call
