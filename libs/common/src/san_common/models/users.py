from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Text
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base, created_at, uuid_pk


class User(Base):
    """Provisioned the first time a valid bearer token names it (`sub` = external_id)."""

    __tablename__ = "users"

    id: Mapped[uuid.UUID] = uuid_pk()
    external_id: Mapped[str] = mapped_column(Text, unique=True)
    timezone: Mapped[str] = mapped_column(Text, server_default="UTC")
    created_at: Mapped[datetime] = created_at()
