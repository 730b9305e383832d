from __future__ import annotations

import datetime

from pydantic import BaseModel, Field

from san_common.usage.ledger import Totals


class UsageTotals(BaseModel):
    """Tokens of the AI calls that answered, and their cost by the worker's price table."""

    promptTokens: int
    completionTokens: int
    embeddingTokens: int
    costUsd: float

    @staticmethod
    def of(totals: Totals) -> UsageTotals:
        return UsageTotals(
            promptTokens=totals.prompt_tokens,
            completionTokens=totals.completion_tokens,
            embeddingTokens=totals.embedding_tokens,
            costUsd=float(totals.cost_usd),
        )


class UsageDay(UsageTotals):
    date: datetime.date = Field(description="UTC day")
    jobType: str
    jobs: int = Field(description="Jobs that made calls that day")


class UsageReport(BaseModel):
    from_: datetime.date = Field(alias="from")
    to: datetime.date
    days: list[UsageDay] = Field(description="Per UTC day and job type, days with usage only")
    total: UsageTotals
