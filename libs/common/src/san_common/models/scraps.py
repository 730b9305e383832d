from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CHAR, DateTime, ForeignKey, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base, created_at, updated_at, uuid_pk


class Scrap(Base):
    __tablename__ = "scraps"
    # Dedup key is per user: the same text saved by two users is two scraps.
    __table_args__ = (UniqueConstraint("user_id", "content_hash"),)

    id: Mapped[uuid.UUID] = uuid_pk()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    content: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(CHAR(64))
    refined_content: Mapped[str | None] = mapped_column(Text)
    refined_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = created_at()
    updated_at: Mapped[datetime] = updated_at()
