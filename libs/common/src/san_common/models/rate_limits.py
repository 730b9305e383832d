from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Double, Text
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base


class RateLimitBucket(Base):
    """One token bucket per (token subject, bucket name), shared by every API replica.

    Keyed by the token's subject rather than the user row, so a request is limited before
    it touches anything else (no user is provisioned by a request that is refused)."""

    __tablename__ = "rate_limit_buckets"

    subject: Mapped[str] = mapped_column(Text, primary_key=True)
    bucket: Mapped[str] = mapped_column(Text, primary_key=True)
    tokens: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
