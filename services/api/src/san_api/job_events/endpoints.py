"""`GET /async-jobs/{jobId}/events`: the job's status changes as Server-Sent Events, to its
owner only, until the job is final. Each event's `id` is its row in `async_job_events`; a
client reconnecting with `Last-Event-ID` gets every later event. Once the job is final and
the client has seen it, the answer is 204, which tells EventSource to stop reconnecting.

A stream lives at most `SSE_STREAM_MAX_SECONDS`: the server then ends it, and the client
(EventSource does it by itself) reconnects with `Last-Event-ID`, losing nothing. How many
streams a user and the process may hold: san_api.job_events.slots."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import san_common.jobs.repository as jobs
from san_api.deps import CurrentUser, SessionDep, SettingsDep
from san_api.errors import NotFound, StreamsBusy, TooManyStreams, ValidationFailed
from san_api.job_events import repository
from san_api.job_events.hub import JobEventHub
from san_api.job_events.slots import SlotStreamingResponse, StreamSlots
from san_api.openapi import problems
from san_common.errors import is_connection_loss
from san_common.jobs.types import TERMINAL_STATUSES
from san_common.models import AsyncJobEvent
from san_common.outages import DATABASE

router = APIRouter(tags=["jobs"])

_FINAL = {s.value for s in TERMINAL_STATUSES}
_MAX_EVENT_ID = 2**63 - 1


def _parse_last_event_id(raw: str | None) -> int:
    if raw is None or raw.strip() == "":
        return 0
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValidationFailed("Last-Event-ID must be an event id this stream sent") from None
    if not 0 <= value <= _MAX_EVENT_ID:
        raise ValidationFailed("Last-Event-ID must be an event id this stream sent")
    return value


def _frame(event: AsyncJobEvent) -> str:
    data = {"jobId": str(event.job_id), "status": event.status, "at": event.at.isoformat()}
    return f"id: {event.id}\nevent: status\ndata: {json.dumps(data)}\n\n"


@router.get(
    "/async-jobs/{jobId}/events",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "status events"},
        204: {"description": "the job is final and the client has seen its last event"},
        **problems(TooManyStreams, StreamsBusy),
    },
)
async def job_events(
    jobId: uuid.UUID,
    request: Request,
    user: CurrentUser,
    session: SessionDep,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> Response:
    """Stream the job's status changes (PENDING → PROCESSING → COMPLETED …) until final."""
    after = _parse_last_event_id(last_event_id)
    job = await jobs.get_for_user(session, jobId, user.user_id)
    if job is None:
        raise NotFound(f"job {jobId} not found")
    backlog = await repository.events_after(session, jobId, after)
    if not backlog and job.status in _FINAL:
        return Response(status_code=204)
    slots: StreamSlots = request.app.state.stream_slots
    slot = slots.take(user.user_id)  # the last check: nothing after it may refuse
    hub: JobEventHub = request.app.state.job_events
    sessions: async_sessionmaker[AsyncSession] = request.app.state.sessions
    loop = asyncio.get_running_loop()
    lifetime = Lifetime(
        loop.time() + settings.sse_stream_max_seconds, settings.sse_keepalive_seconds
    )
    return SlotStreamingResponse(
        _stream(hub, sessions, jobId, after, request, lifetime),
        slot=slot,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@dataclass(frozen=True)
class Lifetime:
    """When the stream ends (loop time), and how long it may be silent meanwhile."""

    ends_at: float
    keepalive: float

    def next_wait(self) -> float:
        """Seconds to wait for a change before a keep-alive; 0 once the stream is over."""
        left = self.ends_at - asyncio.get_running_loop().time()
        return max(0.0, min(self.keepalive, left))


async def _stream(
    hub: JobEventHub,
    sessions: async_sessionmaker[AsyncSession],
    job_id: uuid.UUID,
    after: int,
    request: Request,
    lifetime: Lifetime,
) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    async with hub.subscribe(job_id) as subscription:
        while True:
            subscription.wake.clear()
            try:
                async with sessions() as session:
                    events = await repository.events_after(session, job_id, after)
            except Exception as exc:
                if not is_connection_loss(exc):
                    raise
                # the stream ends; the client comes back (`retry`) with Last-Event-ID once
                # the database answers. The outage is the process's one WARNING.
                DATABASE.lost(exc, "job-events stream")
                return
            for event in events:
                after = event.id
                yield _frame(event)
                if event.status in _FINAL:
                    return
            if len(events) == 100:
                continue  # a long history: read on before waiting
            if await request.is_disconnected():
                return
            wait = lifetime.next_wait()
            if wait <= 0:
                yield ": lifetime over; reconnect with Last-Event-ID\n\n"
                return
            try:
                await asyncio.wait_for(subscription.wake.wait(), timeout=wait)
            except TimeoutError:
                yield ": keepalive\n\n"
