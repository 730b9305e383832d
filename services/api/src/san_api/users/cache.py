"""Which token subjects already have a user row, so an authenticated request provisions
nothing once its user exists (before, every request ran an INSERT … ON CONFLICT and a
SELECT: ~9 % of `POST /scraps`'s CPU, and two round trips, GETs included).

Only ids of *committed* rows are remembered: a row created by this request's own
transaction is not (the request may still roll back); the next request finds it and
remembers it then. User rows are never deleted, so a remembered id stays valid; the
cache is per process and bounded (least recently used out first).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict


class ProvisionedUsers:
    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._ids: OrderedDict[str, uuid.UUID] = OrderedDict()

    def get(self, subject: str) -> uuid.UUID | None:
        user_id = self._ids.get(subject)
        if user_id is not None:
            self._ids.move_to_end(subject)
        return user_id

    def remember(self, subject: str, user_id: uuid.UUID) -> None:
        self._ids[subject] = user_id
        self._ids.move_to_end(subject)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
