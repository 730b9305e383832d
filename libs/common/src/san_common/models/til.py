from __future__ import annotations

import uuid
from datetime import date, datetime

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    CheckConstraint,
    Column,
    Date,
    DateTime,
    ForeignKey,
    Integer,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import EMBEDDING_DIMENSIONS, Base, created_at, updated_at, uuid_pk

# Lifecycle of a TIL document or a quiz generation; mirrors its job's status.
TIL_STATUSES = ("PENDING", "PROCESSING", "COMPLETED", "FAILED")


class DailySummary(Base):
    """A user's TIL document for one date (in the user's time zone)."""

    __tablename__ = "daily_summaries"
    # One row per user and date: this constraint is what serializes the first insert.
    __table_args__ = (
        UniqueConstraint("user_id", "target_date"),
        CheckConstraint(
            "status IN ('PENDING', 'PROCESSING', 'COMPLETED', 'FAILED')", name="status"
        ),
    )

    id: Mapped[uuid.UUID] = uuid_pk()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    target_date: Mapped[date] = mapped_column(Date)
    status: Mapped[str] = mapped_column(Text, server_default="PENDING")
    title: Mapped[str | None] = mapped_column(Text)
    til_markdown: Mapped[str | None] = mapped_column(Text)
    embedding: Mapped[list[float] | None] = mapped_column(Vector(EMBEDDING_DIMENSIONS))
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


daily_summary_cards = Table(
    "daily_summary_cards",
    Base.metadata,
    Column("summary_id", ForeignKey("daily_summaries.id", ondelete="CASCADE"), primary_key=True),
    Column("card_id", ForeignKey("knowledge_cards.id", ondelete="CASCADE"), primary_key=True),
)


class RecallQuizGeneration(Base):
    __tablename__ = "recall_quiz_generations"
    __table_args__ = (
        CheckConstraint(
            "status IN ('PENDING', 'PROCESSING', 'COMPLETED', 'FAILED')", name="status"
        ),
    )

    id: Mapped[uuid.UUID] = uuid_pk()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    target_date: Mapped[date] = mapped_column(Date)
    quiz_types: Mapped[list[str]] = mapped_column(ARRAY(Text))
    status: Mapped[str] = mapped_column(Text, server_default="PENDING")
    error_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RecallQuiz(Base):
    __tablename__ = "recall_quizzes"
    __table_args__ = (
        CheckConstraint("quiz_type IN ('OX', 'SHORT_ANSWER')", name="quiz_type"),
        UniqueConstraint("generation_id", "position"),
    )

    id: Mapped[uuid.UUID] = uuid_pk()
    generation_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("recall_quiz_generations.id", ondelete="CASCADE")
    )
    position: Mapped[int] = mapped_column(Integer)
    quiz_type: Mapped[str] = mapped_column(Text)
    question: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    explanation: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at()
