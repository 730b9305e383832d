"""The in-flight window of each job queue: how many more messages the relay may admit.

A message published into a queue waits behind every message ready in it, whoever they
belong to. So the relay keeps each job queue's ready messages under a window
W = max(`RELAY_WINDOW_MIN`, consumers × `RELAY_WINDOW_PER_CONSUMER`, what the consumers
took in the last `RELAY_WINDOW_SECONDS`) and leaves the rest due in the outbox, where the
fair claim orders it (interactive first, then round-robin by user; docs/architecture.md,
"Fair share and priorities"). The last term sizes the window by throughput: a message
waits behind about that many seconds of work whatever the jobs cost, and fast consumers
are never starved between two refills (the same few messages per consumer would hold a
drain of millisecond jobs to the relay's polling).

The ready count and the consumers come from a passive declare. Between two reads the
relay counts what it has admitted since (and what its rounds are publishing) on top of
the last read: consumers only take messages away, so the estimate can only be too high,
which costs a re-read, never an overshoot. Other relays' admissions are not counted:
each relay may fill a window once (the overshoot the docs state).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from aio_pika.abc import AbstractChannel, AbstractConnection

from san_common.broker.depths import Depth, read_depth
from san_common.broker.topology import Topology
from san_common.jobs import registry

READ_TIMEOUT_SECONDS = 5.0


@dataclass
class QueueWindow:
    name: str
    ready: int = 0  # as last read
    consumers: int = 0
    read_at: float = float("-inf")  # monotonic
    admitted: int = 0  # confirmed by the broker since the read
    in_flight: int = 0  # being published by a round
    # (monotonic, messages the consumers took since the read before): the throughput term
    taken: deque[tuple[float, int]] = field(default_factory=deque)
    recent: int = 0  # the sum of `taken`

    def size(self, least: int, per_consumer: int) -> int:
        return max(least, self.consumers * per_consumer, self.recent)

    def note_taken(self, now: float, count: int, horizon: float) -> None:
        """The consumers took `count` since the last read: at most what was counted ready
        (the last read plus what was admitted since) less what is ready now. Other relays'
        admissions make it look smaller, never larger: a window too small, not too big."""
        if count > 0 and horizon > 0:
            self.taken.append((now, count))
            self.recent += count
        while self.taken and now - self.taken[0][0] > horizon:
            self.recent -= self.taken.popleft()[1]


class Windows:
    def __init__(
        self,
        topology: Topology,
        *,
        least: int,
        per_consumer: int,
        seconds: float,
        poll_seconds: float,
    ) -> None:
        self._least = least
        self._per_consumer = per_consumer
        self._seconds = seconds
        self._poll = poll_seconds
        names = sorted({topology.queue_name(t) for t in registry.job_types()})
        self._queues = {name: QueueWindow(name) for name in names}
        self._number = {name: n for n, name in enumerate(names, start=1)}  # SQL arrays: 1-based
        self._queue_of = {str(t): topology.queue_name(t) for t in registry.job_types()}
        self._channel: AbstractChannel | None = None
        # the queues the last fair claim left due messages behind for (0: a routing key of
        # no job queue, or the batch size): while any, rounds claim fairly at once
        self._held: frozenset[int] = frozenset()

    def claim_arguments(self) -> tuple[list[str], list[int], list[int]]:
        """(routing keys, each key's queue number, each queue's room): claim_outbox_fair's."""
        keys = list(self._queue_of)
        numbers = [self._number[self._queue_of[k]] for k in keys]
        rooms = [self.room(q) for q in self._queues.values()]
        return keys, numbers, rooms

    def queue_of(self, routing_key: str) -> str | None:
        return self._queue_of.get(routing_key)

    def keys_of(self, queue: str) -> list[str]:
        return [k for k, q in self._queue_of.items() if q == queue]

    def names(self) -> list[str]:
        return list(self._queues)

    def size(self, queue: QueueWindow) -> int:
        queue.note_taken(time.monotonic(), 0, self._seconds)  # what aged out of the horizon
        return queue.size(self._least, self._per_consumer)

    def room(self, queue: QueueWindow) -> int:
        size = self.size(queue)
        return max(0, size - queue.ready - queue.admitted - queue.in_flight)

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def hold(self, queue_numbers: frozenset[int]) -> None:
        self._held = queue_numbers

    def wants_refill(self) -> bool:
        """A queue the last fair claim left messages behind for has at least half its
        window free: worth a claim. (Claiming for every message a consumer takes would run
        the claim at the consumers' rate.)"""
        if 0 in self._held:
            return True
        return any(
            self.room(q) * 2 >= self.size(q)
            for q in self._queues.values()
            if self._number[q.name] in self._held
        )

    def fits(self, routing_keys: Iterable[str]) -> list[str]:
        """The queues `routing_keys`' messages would overfill (empty: they all fit)."""
        counts = Counter(self._queue_of.get(k) for k in routing_keys)
        return [
            name
            for name, n in counts.items()
            if name is not None and n > self.room(self._queues[name])
        ]

    def occupied(self) -> list[str]:
        """The queues counted with messages ready, or never read."""
        return [n for n, q in self._queues.items() if q.ready + q.admitted > 0 or q.read_at < 0]

    def stale(self, names: Iterable[str]) -> list[str]:
        now = time.monotonic()
        return [n for n in names if now - self._queues[n].read_at >= self._poll]

    async def ready_in(self, connection: AbstractConnection, name: str) -> int:
        """The messages ready in queue `name` now (a bulk lane's, say: not windowed)."""
        return (await self._read_depth(connection, name)).ready

    async def _read_depth(self, connection: AbstractConnection, name: str) -> Depth:
        # a passive declare, on a channel of its own: a queue gone closes it, not the
        # publishing channel
        if self._channel is None or self._channel.is_closed:
            self._channel = await connection.channel()
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            return await read_depth(self._channel, name)

    async def read(self, connection: AbstractConnection, names: Iterable[str]) -> None:
        """Re-read `names`' ready messages and consumers."""
        for name in names:
            queue = self._queues[name]
            depth = await self._read_depth(connection, name)
            now = time.monotonic()
            if queue.read_at > float("-inf"):
                taken = queue.ready + queue.admitted - depth.ready
                queue.note_taken(now, taken, self._seconds)
            queue.ready, queue.consumers = depth.ready, depth.consumers
            queue.read_at = now
            queue.admitted = 0

    def reserve(self, routing_keys: Iterable[str]) -> Counter[str]:
        taken = Counter(q for k in routing_keys if (q := self._queue_of.get(k)) is not None)
        for name, n in taken.items():
            self._queues[name].in_flight += n
        return taken

    def settle(self, taken: Counter[str], confirmed: Counter[str]) -> None:
        for name, n in taken.items():
            queue = self._queues[name]
            queue.in_flight -= n
            queue.admitted += confirmed.get(name, 0)

    def state(self) -> dict[str, tuple[int, int]]:
        """Per queue: (window, estimated ready): the metrics' view."""
        return {
            name: (self.size(q), q.ready + q.admitted + q.in_flight)
            for name, q in self._queues.items()
        }
