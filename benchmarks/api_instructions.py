"""Instructions per `POST /scraps`: the real `san-api` process and the bare endpoint
(benchmarks/bare_api.py), each under `valgrind --tool=callgrind`, counted over the same
number of requests after a warm-up. Instructions do not move with the machine's load the
way CPU seconds and rates do, so a change of a few percent shows; they leave out the
kernel (the sockets' and the log's writes) and the time spent waiting on caches.

    .venv/bin/python -m benchmarks.api_instructions [--requests 300] [--name NAME]

Needs valgrind. Prints a Markdown table and writes it to benchmarks/results/NAME.md.
Slow (about two minutes a server): not part of `make bench`.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import platform
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import httpx

from benchmarks.san_ratios import (
    SECRET,
    VENV_BIN,
    _api_env,
    _migrated,
    _wait_http,
    bare_command,
    bare_env,
)
from san_api.auth.tokens import mint
from tests import infra

RESULTS = Path(__file__).parent / "results"
WARM_UP = 100
IN_FLIGHT = 4


def _command(name: str, port: int, out: str) -> list[str]:
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    if name == "bare":
        return [*valgrind, *bare_command(port)]
    return [*valgrind, str(VENV_BIN / "san-api")]


async def _post(url: str, subject: str, count: int) -> None:
    headers = {"Authorization": f"Bearer {mint(SECRET, subject)}"}
    slots = asyncio.Semaphore(IN_FLIGHT)
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(n: int) -> None:
            async with slots:
                content = f"instructions {n} {uuid.uuid4().hex}"
                answer = await client.post(url, json={"content": content}, headers=headers)
                answer.raise_for_status()

        await asyncio.gather(*(one(n) for n in range(count)))


def _total(path: str) -> int:
    with open(path, errors="replace") as dump:
        for line in dump:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"{path}: no totals")


def _start(
    name: str, database_url: str, amqp_url: str, work: Path
) -> tuple[subprocess.Popen[bytes], str, str]:
    """The server under callgrind (counting nothing yet), its URL and its ready path."""
    port = infra.free_port()
    if name == "bare":
        env = bare_env(database_url)
        ready = "/docs"
    else:
        env = {**_api_env(database_url, amqp_url, port), "AMQP_PREFIX": work.name[-12:]}
        ready = "/healthz"
    with open(f"{work}.log", "wb") as log:
        process = subprocess.Popen(
            _command(name, port, f"{work}.%p"),
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, f"http://127.0.0.1:{port}", ready


def _callgrind(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


async def _count(name: str, database_url: str, amqp_url: str, requests: int) -> float:
    work = Path(os.environ.get("BENCH_LOG_DIR", "/tmp")) / f"callgrind-{name}-{uuid.uuid4().hex}"
    process, url, ready = _start(name, database_url, amqp_url, work)
    try:
        await _wait_http(url + ready, process, timeout=600)
        subject = f"instructions-{name}-{uuid.uuid4().hex}"
        await _post(url + "/scraps", subject, WARM_UP)
        pid = str(process.pid)
        await asyncio.to_thread(_callgrind, "-i", "on", pid)
        await _post(url + "/scraps", subject, requests)
        await asyncio.to_thread(_callgrind, "-d", pid)
        dumps = sorted(glob.glob(f"{work}.{pid}.*"), key=os.path.getmtime)
        return _total(dumps[-1]) / requests
    finally:
        process.terminate()
        process.wait(60)
        for leftover in glob.glob(f"{work}*"):
            os.unlink(leftover)


async def main_async(args: argparse.Namespace) -> str:
    with infra.postgres_server() as server, infra.rabbitmq_server() as amqp_url:
        database_url = await _migrated(server, f"bench_instructions_{uuid.uuid4().hex[:8]}")
        san = await _count("san", database_url, amqp_url, args.requests)
        bare = await _count("bare", database_url, amqp_url, args.requests)
    return "\n".join(
        [
            "### Instructions per `POST /scraps` (callgrind)",
            f"Python {platform.python_version()}; {args.requests} requests after {WARM_UP}"
            f" of warm-up, {IN_FLIGHT} in flight; the API process only.",
            "",
            "| server | instructions a request (M) |",
            "|---|---|",
            f"| SAN (`san-api`, rate limiter off) | {san / 1e6:.3f} |",
            f"| bare FastAPI + asyncpg (baseline) | {bare / 1e6:.3f} |",
            f"| ratio | {san / bare:.3f}× |",
            "",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--name", default="api-instructions")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("needs valgrind (apt-get install -y valgrind)", file=sys.stderr)
        return 2
    table = asyncio.run(main_async(args))
    print(table)
    (RESULTS / f"{args.name}.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
