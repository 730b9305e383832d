"""The group-commit batcher on its own: what goes out together, what each caller gets."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from san_common.worker.batching import Batcher


class Recorder:
    """A flush that records its batches and answers `item * 10` (or the item's exception)."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.batches: list[list[int]] = []
        self.gate = gate
        self.abandoned: list[tuple[int, int]] = []

    async def flush(self, items: Sequence[int]) -> list[int | BaseException]:
        self.batches.append(list(items))
        if self.gate is not None:
            await self.gate.wait()
        return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in items]

    async def abandon(self, item: int, result: int) -> None:
        self.abandoned.append((item, result))


async def test_a_lone_call_goes_out_at_once_and_calls_meanwhile_form_the_next_batch() -> None:
    gate = asyncio.Event()
    recorder = Recorder(gate)
    batcher: Batcher[int, int] = Batcher(recorder.flush)
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert recorder.batches == [[1]]  # not held back waiting for company
    rest = [asyncio.create_task(batcher.submit(i)) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    gate.set()
    assert await first == 10
    assert [await r for r in rest] == [20, 30, 40]
    assert recorder.batches == [[1], [2, 3, 4]]


async def test_each_caller_gets_its_own_result_or_error_and_batches_are_bounded() -> None:
    recorder = Recorder()
    batcher: Batcher[int, int] = Batcher(recorder.flush, max_size=2)
    results = await asyncio.gather(
        *(batcher.submit(i) for i in (1, -2, 3, 4, 5)), return_exceptions=True
    )
    assert results[0] == 10 and isinstance(results[1], ValueError) and results[2:] == [30, 40, 50]
    assert all(len(b) <= 2 for b in recorder.batches)
    assert sorted(i for b in recorder.batches for i in b) == [-2, 1, 3, 4, 5]


async def test_a_flush_that_raises_fails_every_caller_of_its_batch() -> None:
    async def broken(items: Sequence[int]) -> list[int | BaseException]:
        raise ConnectionError("database gone")

    batcher: Batcher[int, int] = Batcher(broken)
    results = await asyncio.gather(*(batcher.submit(i) for i in (1, 2)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)


async def test_a_caller_cancelled_before_its_flush_is_left_out_of_it() -> None:
    gate = asyncio.Event()
    recorder = Recorder(gate)
    batcher: Batcher[int, int] = Batcher(recorder.flush, abandoned=recorder.abandon)
    first = asyncio.create_task(batcher.submit(1))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(batcher.submit(2))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set()
    assert await first == 10
    assert recorder.batches == [[1]] and recorder.abandoned == []


async def test_a_result_whose_caller_was_cancelled_mid_flush_is_handed_to_abandoned() -> None:
    gate = asyncio.Event()
    recorder = Recorder(gate)
    batcher: Batcher[int, int] = Batcher(recorder.flush, abandoned=recorder.abandon)
    caller = asyncio.create_task(batcher.submit(7))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert recorder.batches == [[7]]  # in the database now
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert recorder.abandoned == [(7, 70)]
