"""Group commit for the runtime's hot statements.

Every running job asks the store for its own claim and its own completion, one call each;
a `Batcher` turns the calls that arrive while the previous flush is still in the database
into one flush of their own. A lone call goes out at once (no timer, no added latency);
under load, a batch forms by itself while the database works, and the per-job cost of a
round trip, a transaction and a statement is shared by the whole batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Flush = Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]]


class Batcher(Generic[T, R]):
    def __init__(
        self,
        flush: Flush[T, R],
        *,
        max_size: int = 100,
        abandoned: Callable[[T, R], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        """`flush` answers each item of a batch, in order, with its result or the exception
        to raise to its caller. `abandoned` is told of a result whose caller was cancelled
        while its batch was in the database (a claim nobody will run gets released)."""
        self._flush = flush
        self._max_size = max_size
        self._abandoned = abandoned
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._run())
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if any(f is future for _, f in self._pending):
                self._pending = [(i, f) for i, f in self._pending if f is not future]
            else:
                future.add_done_callback(lambda done: self._abandon(item, done))
            raise

    def _abandon(self, item: T, done: asyncio.Future[R]) -> None:
        # Retrieving the exception also keeps asyncio from logging it as never retrieved.
        if done.cancelled() or done.exception() is not None or self._abandoned is None:
            return
        task = asyncio.get_running_loop().create_task(self._abandoned(item, done.result()))
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def _run(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_size]
                del self._pending[: self._max_size]
                try:
                    results = await self._flush([item for item, _ in batch])
                except asyncio.CancelledError:
                    for _, future in batch:
                        future.cancel()
                    raise
                except Exception as exc:  # the whole batch failed the same way (an outage)
                    results = [exc] * len(batch)
                for (_, future), result in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._flusher = None
            for _, future in self._pending:  # cancelled flusher: nobody will answer these
                future.cancel()
            self._pending.clear()


# Strong references to the release tasks of abandoned results (asyncio keeps weak ones).
_background: set[asyncio.Task[None]] = set()
