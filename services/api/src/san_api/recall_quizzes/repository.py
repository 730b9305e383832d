from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from san_common.models import RecallQuiz, RecallQuizGeneration


async def get_for_user(
    session: AsyncSession, generation_id: uuid.UUID, user_id: uuid.UUID
) -> RecallQuizGeneration | None:
    return await session.scalar(
        select(RecallQuizGeneration).where(
            RecallQuizGeneration.id == generation_id, RecallQuizGeneration.user_id == user_id
        )
    )


async def quizzes_of(session: AsyncSession, generation_id: uuid.UUID) -> list[RecallQuiz]:
    result = await session.scalars(
        select(RecallQuiz)
        .where(RecallQuiz.generation_id == generation_id)
        .order_by(RecallQuiz.position)
    )
    return list(result)
