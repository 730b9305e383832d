from __future__ import annotations

import re
import uuid
from datetime import date, datetime
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from san_api.cards.schemas import SimilarCard

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_date(value: object) -> object:
    # Pydantic's lax date parsing also takes timestamps and datetimes; a calendar day is
    # only ever written YYYY-MM-DD on this API.
    if isinstance(value, date):
        return value
    if not isinstance(value, str) or not _ISO_DATE.fullmatch(value):
        raise ValueError("must be a date in the format YYYY-MM-DD")
    return value


IsoDate = Annotated[date, BeforeValidator(_iso_date)]


class TilCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targetDate: IsoDate = Field(description="The day (in the user's time zone) to write up")


class TilAccepted(BaseModel):
    summaryId: uuid.UUID
    jobId: uuid.UUID
    targetId: uuid.UUID = Field(description="The job's target: the summary id")


class Til(BaseModel):
    summaryId: uuid.UUID
    targetDate: date
    status: str = Field(description="PENDING, PROCESSING, COMPLETED or FAILED")
    title: str | None
    tilMarkdown: str | None = Field(
        description="The latest completed document; kept while a regeneration runs or fails"
    )
    errorMessage: str | None
    sourceCardIds: list[uuid.UUID] = Field(description="The cards the document was written from")
    createdAt: datetime
    updatedAt: datetime
    completedAt: datetime | None


class TilPage(BaseModel):
    items: list[Til] = Field(description="Newest target date first")
    nextCursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end"
    )


class RecallCards(BaseModel):
    summaryId: uuid.UUID
    threshold: float
    fallback: bool = Field(
        description="True when no card was within the threshold and the K nearest are returned"
    )
    cards: list[SimilarCard]
