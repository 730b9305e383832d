"""A failed broker connection leaves nothing behind to be closed by the garbage collector.

aio-pika's `connect` drops the connection object it could not connect unclosed; its
`__del__` then creates a `close()` coroutine that no loop may run — where the collector
happens to run (a thread without a loop), a "never awaited" warning, which the suite turns
into a failure of whichever test is running then."""

from __future__ import annotations

import asyncio
import gc

import pytest

from san_common.broker.connect import connect

UNREACHABLE = "amqp://guest:guest@127.0.0.1:1/"


@pytest.mark.parametrize("robust", [False, True])
async def test_a_failed_connect_leaves_nothing_for_the_collector(robust: bool) -> None:
    for _ in range(3):
        with pytest.raises(OSError):
            await connect(UNREACHABLE, robust=robust, connect_timeout=5)
    # collected in a thread with no event loop, as `asyncio.to_thread` code does
    await asyncio.to_thread(gc.collect)


async def test_a_connect_cut_short_leaves_nothing_for_the_collector() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # a broker that accepts and then says nothing

    server = await asyncio.start_server(never_answers, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for _ in range(3):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(connect(f"amqp://guest:guest@127.0.0.1:{port}/"), 0.2)
    finally:
        server.close()
        for writer in accepted:
            writer.close()
            await writer.wait_closed()
        await server.wait_closed()
    await asyncio.to_thread(gc.collect)
