"""The AI usage ledger and per-user budget overrides (docs/architecture.md, "The usage
ledger")."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal

from sqlalchemy import BigInteger, Boolean, DateTime, Identity, Index, Integer, Numeric, Text
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base, created_at


class AiUsage(Base):
    """One row per AI call that answered, written by the worker that made it. No foreign
    keys: the ledger is what was paid for, and it outlives the jobs (retention) it counts."""

    __tablename__ = "ai_usage"
    __table_args__ = (
        Index("ix_ai_usage_user_id_at", "user_id", "at"),
        Index("ix_ai_usage_job_id", "job_id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    at: Mapped[datetime] = created_at()
    job_id: Mapped[uuid.UUID]
    try_no: Mapped[int] = mapped_column(Integer)
    user_id: Mapped[uuid.UUID]
    job_type: Mapped[str] = mapped_column(Text)
    model: Mapped[str] = mapped_column(Text)
    call: Mapped[str] = mapped_column(Text)  # "chat" or "embedding"
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    embedding_tokens: Mapped[int] = mapped_column(Integer)
    # The answer had no `usage`: the tokens were estimated from the text's length.
    estimated: Mapped[bool] = mapped_column(Boolean)
    latency_ms: Mapped[int] = mapped_column(Integer)
    cost_usd: Mapped[Decimal] = mapped_column(Numeric(18, 9))


class UserBudget(Base):
    """An operator's override of a user's budget; a NULL limit keeps the setting's default,
    0 means unlimited."""

    __tablename__ = "user_budgets"

    user_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    usd_per_month: Mapped[Decimal | None] = mapped_column(Numeric(14, 4))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_by: Mapped[str] = mapped_column(Text)
