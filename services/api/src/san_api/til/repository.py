from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import defer

from san_common.models import DailySummary, KnowledgeCard, daily_summary_cards

# The vector is only read by `embedding_of`; never load it as a side effect.
_WITHOUT_EMBEDDING = defer(DailySummary.embedding, raiseload=True)


async def has_cards_between(
    session: AsyncSession, user_id: uuid.UUID, start: datetime, end: datetime
) -> bool:
    return bool(
        await session.scalar(
            select(
                exists().where(
                    KnowledgeCard.user_id == user_id,
                    KnowledgeCard.created_at >= start,
                    KnowledgeCard.created_at < end,
                )
            )
        )
    )


async def get_for_user(
    session: AsyncSession, summary_id: uuid.UUID, user_id: uuid.UUID
) -> DailySummary | None:
    return await session.scalar(
        select(DailySummary)
        .options(_WITHOUT_EMBEDDING)
        .where(DailySummary.id == summary_id, DailySummary.user_id == user_id)
    )


async def page(
    session: AsyncSession,
    user_id: uuid.UUID,
    *,
    day: date | None,
    before: date | None,
    limit: int,
) -> list[DailySummary]:
    """The user's TILs, newest target date first; (user, date) is unique, so the date is a
    total order and `before` a stable keyset cursor."""
    query = select(DailySummary).options(_WITHOUT_EMBEDDING).where(DailySummary.user_id == user_id)
    if day is not None:
        query = query.where(DailySummary.target_date == day)
    if before is not None:
        query = query.where(DailySummary.target_date < before)
    result = await session.scalars(query.order_by(DailySummary.target_date.desc()).limit(limit))
    return list(result)


async def source_card_ids(
    session: AsyncSession, summary_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[uuid.UUID]]:
    found: dict[uuid.UUID, list[uuid.UUID]] = {summary_id: [] for summary_id in summary_ids}
    if summary_ids:
        rows = await session.execute(
            select(daily_summary_cards.c.summary_id, daily_summary_cards.c.card_id)
            .join(KnowledgeCard, KnowledgeCard.id == daily_summary_cards.c.card_id)
            .where(daily_summary_cards.c.summary_id.in_(list(summary_ids)))
            .order_by(KnowledgeCard.created_at, KnowledgeCard.id)
        )
        for summary_id, card_id in rows:
            found[summary_id].append(card_id)
    return found


async def embedding_of(
    session: AsyncSession, summary_id: uuid.UUID, user_id: uuid.UUID
) -> tuple[bool, Any | None]:
    """(exists for this user, its embedding or None while no document was generated)."""
    row = (
        await session.execute(
            select(DailySummary.embedding).where(
                DailySummary.id == summary_id, DailySummary.user_id == user_id
            )
        )
    ).one_or_none()
    return (False, None) if row is None else (True, row[0])
