from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, Integer, Text, func
from sqlalchemy.orm import Mapped, mapped_column

from san_common.models.base import Base


class UpstreamQuota(Base):
    """What is left of one upstream's budget (an AI base URL and model, a GitHub token's
    digest), shared by every worker of the deployment. Written only by
    `san_common.quotas`; None: not known yet."""

    __tablename__ = "upstream_quotas"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    requests_limit: Mapped[int | None] = mapped_column(Integer)
    requests_remaining: Mapped[int | None] = mapped_column(Integer)
    requests_reset_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    tokens_limit: Mapped[int | None] = mapped_column(BigInteger)
    tokens_remaining: Mapped[int | None] = mapped_column(BigInteger)
    tokens_reset_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Calls reserved and not yet answered: the upstream had not counted them when it
    # last said what was left.
    in_flight: Mapped[int] = mapped_column(Integer, server_default="0")
    in_flight_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")
    waits: Mapped[int] = mapped_column(BigInteger, server_default="0")  # calls refused
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
