from __future__ import annotations

import uuid

from pydantic import BaseModel, ConfigDict, Field


class ScrapCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    content: str = Field(description="The text read; CRLF becomes LF and it is trimmed")


class ScrapAccepted(BaseModel):
    scrapId: uuid.UUID
    analysisJobId: uuid.UUID | None = Field(
        description="the job that makes the scrap's card: registered now or, for a duplicate,"
        " the one still on its way; null when the card already exists"
    )
    refineJobId: uuid.UUID | None = Field(description="null when no job was registered")
    duplicate: bool = Field(description="true when this user had already saved the same content")
