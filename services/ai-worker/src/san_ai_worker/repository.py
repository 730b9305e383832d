"""Queries of the ai-worker."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, delete, exists, func, literal, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import (
    Category,
    DailySummary,
    GithubAccount,
    GithubStarRecommendation,
    KnowledgeCard,
    RecallQuiz,
    RecallQuizGeneration,
    Scrap,
    Tag,
    card_tags,
    daily_summary_cards,
)
from san_common.worker import Write


async def get_scrap(session: AsyncSession, scrap_id: uuid.UUID) -> Scrap | None:
    return await session.get(Scrap, scrap_id)


async def card_exists(session: AsyncSession, scrap_id: uuid.UUID) -> bool:
    return bool(await session.scalar(select(exists().where(KnowledgeCard.scrap_id == scrap_id))))


async def find_or_create_category(
    session: AsyncSession, user_id: uuid.UUID, name: str
) -> uuid.UUID:
    """Concurrency-safe: a racing insert of the same name makes ours wait, then conflict."""
    await session.execute(
        insert(Category)
        .values(user_id=user_id, name=name)
        .on_conflict_do_nothing(index_elements=["user_id", "name"])
    )
    found = await session.scalar(
        select(Category.id).where(Category.user_id == user_id, Category.name == name)
    )
    assert found is not None
    return found


async def find_or_create_tags(
    session: AsyncSession, user_id: uuid.UUID, names: Sequence[str]
) -> list[uuid.UUID]:
    if not names:
        return []
    # Sorted, so two transactions inserting overlapping tag sets lock in the same order.
    ordered = sorted(set(names))
    await session.execute(
        insert(Tag)
        .values([{"user_id": user_id, "name": n} for n in ordered])
        .on_conflict_do_nothing(index_elements=["user_id", "name"])
    )
    found = await session.scalars(
        select(Tag.id).where(Tag.user_id == user_id, Tag.name.in_(ordered))
    )
    return list(found)


async def insert_card(
    session: AsyncSession,
    *,
    scrap: Scrap,
    category_id: uuid.UUID | None,
    title: str,
    summary: str,
    embedding: Sequence[float],
) -> uuid.UUID | None:
    """None when the scrap already has its card (a duplicate delivery got there first)."""
    return await session.scalar(
        insert(KnowledgeCard)
        .values(
            user_id=scrap.user_id,
            scrap_id=scrap.id,
            category_id=category_id,
            title=title,
            summary=summary,
            embedding=list(embedding),
        )
        .on_conflict_do_nothing(index_elements=["scrap_id"])
        .returning(KnowledgeCard.id)
    )


async def link_tags(
    session: AsyncSession, card_id: uuid.UUID, tag_ids: Sequence[uuid.UUID]
) -> None:
    if tag_ids:
        await session.execute(
            insert(card_tags)
            .values([{"card_id": card_id, "tag_id": t} for t in tag_ids])
            .on_conflict_do_nothing()
        )


_SET_REFINED_CONTENT = (
    update(Scrap)
    .where(Scrap.id == bindparam("scrap_id"))
    .values(refined_content=bindparam("refined"), refined_at=func.now(), updated_at=func.now())
)


def refined_content(scrap_id: uuid.UUID, refined: str) -> Write:
    """The scrap's refined text, as one write (the refines completing together share it)."""
    return Write(_SET_REFINED_CONTENT, {"scrap_id": scrap_id, "refined": refined})


# -- TIL and recall quizzes -------------------------------------------------------------------


@dataclass(frozen=True)
class DayCard:
    card_id: uuid.UUID
    title: str
    summary: str
    category: str | None
    tags: list[str]


@dataclass(frozen=True)
class NewQuiz:
    quiz_type: str
    question: str
    answer: str
    explanation: str


async def get_summary(session: AsyncSession, summary_id: uuid.UUID) -> DailySummary | None:
    return await session.get(DailySummary, summary_id)


async def get_generation(
    session: AsyncSession, generation_id: uuid.UUID
) -> RecallQuizGeneration | None:
    return await session.get(RecallQuizGeneration, generation_id)


async def cards_created_between(
    session: AsyncSession, user_id: uuid.UUID, start: datetime, end: datetime, limit: int
) -> list[DayCard]:
    """The user's cards with `start <= created_at < end`, oldest first, with their tags."""
    rows = (
        await session.execute(
            select(KnowledgeCard.id, KnowledgeCard.title, KnowledgeCard.summary, Category.name)
            .outerjoin(Category, Category.id == KnowledgeCard.category_id)
            .where(
                KnowledgeCard.user_id == user_id,
                KnowledgeCard.created_at >= start,
                KnowledgeCard.created_at < end,
            )
            .order_by(KnowledgeCard.created_at, KnowledgeCard.id)
            .limit(limit)
        )
    ).all()
    tags: dict[uuid.UUID, list[str]] = {row[0]: [] for row in rows}
    if tags:
        tag_rows = await session.execute(
            select(card_tags.c.card_id, Tag.name)
            .join(Tag, Tag.id == card_tags.c.tag_id)
            .where(card_tags.c.card_id.in_(list(tags)))
            .order_by(Tag.name)
        )
        for card_id, name in tag_rows:
            tags[card_id].append(name)
    return [DayCard(id_, title, summary, cat, tags[id_]) for id_, title, summary, cat in rows]


async def complete_summary(
    session: AsyncSession,
    summary_id: uuid.UUID,
    *,
    title: str,
    til_markdown: str,
    embedding: Sequence[float],
    card_ids: Sequence[uuid.UUID],
) -> bool:
    """Store the document and replace its source cards; False if the row is gone. (Its
    status is the runtime's to write, with the job's: registry `Mirror`.)"""
    updated = await session.scalar(
        update(DailySummary)
        .where(DailySummary.id == summary_id)
        .values(
            title=title,
            til_markdown=til_markdown,
            embedding=list(embedding),
            completed_at=func.now(),
            updated_at=func.now(),
        )
        .returning(DailySummary.id)
    )
    if updated is None:
        return False
    await session.execute(
        delete(daily_summary_cards).where(daily_summary_cards.c.summary_id == summary_id)
    )
    if card_ids:
        # INSERT … SELECT: a card deleted since `load` is skipped instead of breaking the FK.
        await session.execute(
            insert(daily_summary_cards).from_select(
                ["summary_id", "card_id"],
                select(literal(summary_id), KnowledgeCard.id).where(
                    KnowledgeCard.id.in_(list(card_ids))
                ),
            )
        )
    return True


async def complete_generation(
    session: AsyncSession, generation_id: uuid.UUID, quizzes: Sequence[NewQuiz]
) -> bool:
    """Replace the generation's quizzes (positions 1…n). (Its status is the runtime's.)"""
    updated = await session.scalar(
        update(RecallQuizGeneration)
        .where(RecallQuizGeneration.id == generation_id)
        .values(completed_at=func.now(), updated_at=func.now())
        .returning(RecallQuizGeneration.id)
    )
    if updated is None:
        return False
    await session.execute(delete(RecallQuiz).where(RecallQuiz.generation_id == generation_id))
    if quizzes:
        await session.execute(
            insert(RecallQuiz).values(
                [
                    {
                        "generation_id": generation_id,
                        "position": position,
                        "quiz_type": quiz.quiz_type,
                        "question": quiz.question,
                        "answer": quiz.answer,
                        "explanation": quiz.explanation,
                    }
                    for position, quiz in enumerate(quizzes, start=1)
                ]
            )
        )
    return True


# -- GitHub star recommendations --------------------------------------------------------------


@dataclass(frozen=True)
class NewStarRecommendation:
    repo_full_name: str
    html_url: str | None
    description: str | None
    reason: str
    score: float


async def get_github_token(session: AsyncSession, user_id: uuid.UUID) -> str | None:
    """The user's encrypted GitHub token (san_common.crypto), None when not linked."""
    return await session.scalar(
        select(GithubAccount.encrypted_token).where(GithubAccount.user_id == user_id)
    )


async def user_interests(session: AsyncSession, user_id: uuid.UUID, limit: int = 40) -> list[str]:
    """What the user is learning: their cards' categories and tags, most frequent first."""
    categories = await session.execute(
        select(Category.name, func.count())
        .join(KnowledgeCard, KnowledgeCard.category_id == Category.id)
        .where(KnowledgeCard.user_id == user_id)
        .group_by(Category.name)
        .order_by(func.count().desc(), Category.name)
        .limit(limit)
    )
    tags = await session.execute(
        select(Tag.name, func.count())
        .join(card_tags, card_tags.c.tag_id == Tag.id)
        .join(KnowledgeCard, KnowledgeCard.id == card_tags.c.card_id)
        .where(KnowledgeCard.user_id == user_id)
        .group_by(Tag.name)
        .order_by(func.count().desc(), Tag.name)
        .limit(limit)
    )
    ranked = sorted([*categories.all(), *tags.all()], key=lambda row: (-row[1], row[0]))
    return list(dict.fromkeys(name for name, _ in ranked))[:limit]


async def replace_star_recommendations(
    session: AsyncSession,
    user_id: uuid.UUID,
    job_id: uuid.UUID,
    recommendations: Sequence[NewStarRecommendation],
) -> None:
    """The user's recommendations become this job's (in the job's completing transaction,
    so readers see the old set or the new one, never a mix)."""
    await session.execute(
        delete(GithubStarRecommendation).where(GithubStarRecommendation.user_id == user_id)
    )
    if recommendations:
        await session.execute(
            insert(GithubStarRecommendation).values(
                [
                    {
                        "user_id": user_id,
                        "job_id": job_id,
                        "rank": rank,
                        "repo_full_name": rec.repo_full_name,
                        "html_url": rec.html_url,
                        "description": rec.description,
                        "reason": rec.reason,
                        "score": rec.score,
                    }
                    for rank, rec in enumerate(recommendations, start=1)
                ]
            )
        )
