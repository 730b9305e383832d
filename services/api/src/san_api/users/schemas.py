from __future__ import annotations

import uuid
from datetime import datetime
from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, field_validator


@lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    """The IANA database's zone names, from the `tzdata` package SAN pins: not the host's
    zone directory, whose `localtime` (the server's own zone) and `posixrules` are files,
    not zones, and not `Factory` (a placeholder with no offset of its own)."""
    names = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8").split()
    return frozenset(names) - {"Factory"}


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
