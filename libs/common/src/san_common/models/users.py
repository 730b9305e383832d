from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CheckConstraint, Float, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base, created_at, uuid_pk


class User(Base):
    """Provisioned the first time a valid bearer token names it (`sub` = external_id)."""

    __tablename__ = "users"
    __table_args__ = (CheckConstraint("share_weight > 0", name="share_weight_positive"),)

    id: Mapped[uuid.UUID] = uuid_pk()
    external_id: Mapped[str] = mapped_column(Text, unique=True)
    timezone: Mapped[str] = mapped_column(Text, server_default="UTC")
    created_at: Mapped[datetime] = created_at()
    # The user's share of the workers when several users' jobs wait (docs/architecture.md,
    # "Fair share and priorities"): a user of weight 2 gets twice the admissions of one of 1.
    share_weight: Mapped[float] = mapped_column(Float, server_default=text("1"))
