"""A small HTTP/1.1 load generator, run as a process of its own (so its CPU is not the
server's): `concurrency` keep-alive connections, each sending its next request as soon as
the previous answer arrived, for `seconds`. Raw asyncio streams, no HTTP library: a
request costs this process tens of microseconds, so on 2 cores it takes as little from the
server as a Python client can. Prints one JSON line: rate, p50/p99/max latency, statuses.

    python -m benchmarks.loadgen --url http://127.0.0.1:8000 --path /scraps --method POST \\
        --body '{"content": "scrap {n} {run}"}' --header 'Authorization: Bearer …' -c 16

`{n}` in the body is a per-request counter, `{run}` a per-process random id (unique
content: no dedup shortcut). `--paths FILE` cycles through the paths listed in FILE,
`--cycle-header FILE` through the header lines listed in FILE (one per request: many users'
tokens, so that per-user locks and limits are measured as many users meet them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections import Counter
from itertools import count, cycle
from pathlib import Path
from urllib.parse import urlsplit


async def _worker(
    host: str,
    port: int,
    make_request: object,
    deadline: float,
    latencies: list[float],
    statuses: Counter[int],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < deadline:
            request: bytes = make_request()  # type: ignore[operator]
            started = time.perf_counter()
            writer.write(request)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if length:
                await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            statuses[int(status_line.split()[1])] += 1
    finally:
        writer.close()


async def run(args: argparse.Namespace) -> dict[str, object]:
    parts = urlsplit(args.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    headers = "".join(f"{h}\r\n" for h in args.header)
    counter, run_id = count(), uuid.uuid4().hex
    paths = cycle(args.path_list)
    cycled = cycle(args.cycled_headers or [""])

    def make_request() -> bytes:
        path = next(paths)
        headers_now = headers + next(cycled)
        if args.body is None:
            return f"{args.method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers_now}\r\n".encode()
        body = args.body.replace("{n}", str(next(counter))).replace("{run}", run_id).encode()
        return (
            f"{args.method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers_now}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    # warm-up: connections open and the server's first-request costs paid, not measured
    warm: list[float] = []
    await asyncio.gather(
        *(
            _worker(host, port, make_request, time.perf_counter() + args.warmup, warm, Counter())
            for _ in range(args.concurrency)
        )
    )
    started = time.perf_counter()
    await asyncio.gather(
        *(
            _worker(host, port, make_request, started + args.seconds, latencies, statuses)
            for _ in range(args.concurrency)
        )
    )
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000

    return {
        "requests": len(latencies),
        "rate": len(latencies) / elapsed,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": ordered[-1] * 1000,
        "statuses": dict(statuses),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--path", default="/")
    parser.add_argument("--paths", default=None)
    parser.add_argument("--method", default="GET")
    parser.add_argument("--body", default=None)
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--cycle-header", default=None, help="FILE: a header line per request")
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    args.path_list = Path(args.paths).read_text().split() if args.paths else [args.path]
    if args.cycle_header:
        lines = Path(args.cycle_header).read_text().splitlines()
        args.cycled_headers = [f"{line}\r\n" for line in lines if line.strip()]
    else:
        args.cycled_headers = None
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
