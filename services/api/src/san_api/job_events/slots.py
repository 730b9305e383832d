"""How many job event streams an API process holds open, per user and in all.

A stream is a connection held for minutes. Without a bound, one user's streams fill the
process's connection cap and every other request (probes aside) is refused; so each user
may hold `SSE_STREAMS_PER_USER` (beyond: 429) and the process `SSE_STREAMS_MAX`, below
`HTTP_MAX_CONNECTIONS` (beyond: 503), leaving room for everything else. Counted per process:
a client spread over N replicas may hold N times as many, each replica bounded the same.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from san_api.errors import StreamsBusy, TooManyStreams


@dataclass
class Slot:
    """One open stream; `release` is idempotent."""

    slots: StreamSlots
    user_id: uuid.UUID
    held: bool = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.give_back(self.user_id)


class StreamSlots:
    def __init__(self, *, per_user: int, total: int, retry_after: int) -> None:
        self.per_user, self.total, self.retry_after = per_user, total, retry_after
        self._by_user: Counter[uuid.UUID] = Counter()
        self._open = 0

    @property
    def open(self) -> int:
        return self._open

    def take(self, user_id: uuid.UUID) -> Slot:
        """A slot for one more stream of `user_id`, or the error that refuses it."""
        wait = {"Retry-After": str(self.retry_after)}
        if self._by_user[user_id] >= self.per_user:
            raise TooManyStreams(
                f"you have {self.per_user} event streams open, the most allowed; close one"
                f" or retry in {self.retry_after} s",
                headers=wait,
                retryAfterSeconds=self.retry_after,
                limit=self.per_user,
            )
        if self._open >= self.total:
            raise StreamsBusy(
                f"this server holds its {self.total} event streams; retry in"
                f" {self.retry_after} s, or poll GET /async-jobs/{{id}}",
                headers=wait,
                retryAfterSeconds=self.retry_after,
            )
        self._by_user[user_id] += 1
        self._open += 1
        return Slot(self, user_id)

    def give_back(self, user_id: uuid.UUID) -> None:
        self._open -= 1
        self._by_user[user_id] -= 1
        if self._by_user[user_id] <= 0:
            del self._by_user[user_id]


class SlotStreamingResponse(StreamingResponse):
    """A streaming response that gives its slot back however it ends: the stream finished,
    the client went away (Starlette cancels the stream), or sending failed — including
    before the stream's generator ever ran, when its own `finally` would not."""

    def __init__(
        self,
        content: AsyncIterator[str],
        *,
        slot: Slot,
        media_type: str,
        headers: Mapping[str, str],
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()
