"""The fake AI server with a gate: while it is closed every request waits at the door, so a
test knows exactly how many jobs sit inside their AI call when it strikes."""

from __future__ import annotations

import threading
from collections import Counter

from tests.fakes.fake_ai import FakeAiServer, Fault


class GatedAi(FakeAiServer):
    def __init__(self) -> None:
        super().__init__()
        self._gate = threading.Event()
        self._gate.set()
        self._held: Counter[str] = Counter()
        self._answered: Counter[str] = Counter()

    def close_gate(self) -> None:
        self._gate.clear()

    def open_gate(self) -> None:
        self._gate.set()

    def held(self, path: str = "/v1/chat/completions") -> int:
        """Requests on `path` waiting at the closed gate right now."""
        with self._lock:
            return self._held[path]

    def passed(self, path: str = "/v1/chat/completions") -> int:
        """Requests on `path` let through the gate so far (answered or being answered)."""
        with self._lock:
            return self._answered[path]

    def _take_fault(self, path: str) -> Fault | None:
        # Runs in the request's handler thread before the answer is written.
        with self._lock:
            self._held[path] += 1
        try:
            while not self._gate.wait(0.05):
                if self._stopping.is_set():
                    break
        finally:
            with self._lock:
                self._held[path] -= 1
                self._answered[path] += 1
        return super()._take_fault(path)
