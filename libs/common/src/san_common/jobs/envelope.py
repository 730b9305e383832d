"""The job message envelope: the wire contract between the outbox, the relay and workers."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict

# Bumped only with an incompatible change; consumers reject versions they do not know.
ENVELOPE_VERSION = 1


class JobMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    version: int = ENVELOPE_VERSION
    message_id: uuid.UUID
    job_id: uuid.UUID
    job_type: str  # a registry job type (san_common.jobs.registry)
    target_id: uuid.UUID
    user_id: uuid.UUID
    attempt: int
    created_at: datetime
    # W3C trace context, so one trace spans API → relay → worker.
    traceparent: str | None = None
    tracestate: str | None = None
