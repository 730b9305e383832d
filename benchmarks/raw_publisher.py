"""The relay's baseline: a raw aio-pika publisher with `--window` confirms in flight,
publishing the same bodies (SAN envelopes) to the same quorum queue, no database. Run as a
process of its own; prints one JSON line with its rate."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import UTC, datetime

import aio_pika


def envelope() -> bytes:
    return json.dumps(
        {
            "version": 1,
            "message_id": str(uuid.uuid4()),
            "job_id": str(uuid.uuid4()),
            "job_type": "CARD_ANALYSIS",
            "target_id": str(uuid.uuid4()),
            "user_id": str(uuid.uuid4()),
            "attempt": 1,
            "created_at": datetime.now(UTC).isoformat(),
            "traceparent": None,
            "tracestate": None,
        },
        separators=(",", ":"),
    ).encode()


async def publish(
    amqp_url: str, exchange_name: str, routing_key: str, n: int, window: int
) -> float:
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.get_exchange(exchange_name)
    bodies = [envelope() for _ in range(n)]
    in_flight = asyncio.Semaphore(window)

    async def one(body: bytes) -> None:
        try:
            await exchange.publish(
                aio_pika.Message(
                    body,
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=str(uuid.uuid4()),
                ),
                routing_key=routing_key,
                mandatory=True,
            )
        finally:
            in_flight.release()

    started = time.perf_counter()
    tasks = []
    for body in bodies:
        await in_flight.acquire()
        tasks.append(asyncio.create_task(one(body)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    await connection.close()
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--amqp-url", required=True)
    parser.add_argument("--exchange", required=True)
    parser.add_argument("--routing-key", required=True)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--window", type=int, default=100)
    args = parser.parse_args()
    rate = asyncio.run(
        publish(args.amqp_url, args.exchange, args.routing_key, args.messages, args.window)
    )
    print(json.dumps({"rate": rate}))


if __name__ == "__main__":
    main()
