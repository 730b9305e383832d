"""The deployment's identity (docs/architecture.md, "Deployment identity")."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import Boolean, CheckConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base, created_at


class Deployment(Base):
    """One row, made by the migrations: the id every message of this deployment carries
    and every worker checks. A copy of the database is the same deployment."""

    __tablename__ = "deployment"
    __table_args__ = (CheckConstraint("one", name="one_row"),)

    one: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=text("true"))
    deployment_id: Mapped[uuid.UUID] = mapped_column(server_default=text("gen_random_uuid()"))
    created_at: Mapped[datetime] = created_at()
