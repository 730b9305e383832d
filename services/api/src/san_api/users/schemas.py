from __future__ import annotations

import uuid
import zoneinfo
from datetime import datetime
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, field_validator


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


class Me(BaseModel):
    userId: uuid.UUID
    externalId: str
    timezone: str
    createdAt: datetime


class MeUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timezone: str = Field(
        description="IANA time zone (e.g. Asia/Seoul); decides which cards belong to a day",
        max_length=64,
    )

    @field_validator("timezone")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in _known_zones():
            raise ValueError(f"unknown time zone {value!r}; use an IANA name like 'Asia/Seoul'")
        return value
