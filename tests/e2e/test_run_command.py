"""The README's two run commands on their embedded defaults: `make run` (no DATABASE_URL,
no secrets) starts everything and the API answers within the time the README states;
`make demo` walks the README's "Try it" against it and exits 0; Ctrl-C stops every process.
Two `make run` stacks on one broker (their own data directories and ports, no
AMQP_PREFIX) each get queues of their own, and `make demo` passes on both, run again too."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import aio_pika
import httpx
import pytest

from san_common.broker.topology import Topology
from tests import infra
from tests.deploy.services import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]


def readme_start_up_seconds() -> int:
    """The README's promise: the API answers "within **N seconds** of `make run`"."""
    found = re.search(
        r"within \*\*(\d+) seconds\*\* of\s+`make run`", (ROOT / "README.md").read_text()
    )
    assert found, "the README states how soon `make run` serves"
    return int(found.group(1))


def test_make_run_serves_within_the_readme_time_make_demo_walks_it_and_ctrl_c_stops_all(
    amqp_url: str, topology: Topology, tmp_path: Path
) -> None:
    port = infra.free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "AUTH_JWT_SECRET", "TOKEN_ENCRYPTION_KEYS", "MAKEFLAGS")
    }
    env.update(
        DATA_DIR=str(tmp_path / "data"),
        API_PORT=str(port),
        AMQP_URL=amqp_url,
        AMQP_PREFIX=topology.prefix,  # the fixture deletes its queues afterwards
    )
    log_path = tmp_path / "run.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        launcher = subprocess.Popen(
            ["make", "-s", "run"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,  # Ctrl-C reaches the whole foreground group: make, uv, us
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = started + readme_start_up_seconds()
        while True:
            assert launcher.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"no API within the README's time:\n{log_path.read_text()}"
            )
            time.sleep(0.2)  # poll interval, inside the deadline above
        demo = subprocess.run(
            ["make", "-s", "demo"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
        )
        assert demo.returncode == 0, demo.stdout + demo.stderr + log_path.read_text()[-4000:]
        for step in ("POST /scraps", "/async-jobs/", "/similar-cards", '"COMPLETED"'):
            assert step in demo.stdout, demo.stdout
    finally:
        os.killpg(launcher.pid, signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            raise
    output = log_path.read_text()
    # make itself dies of the SIGINT it was sent (as at a terminal); the launcher stopped cleanly
    assert launcher.returncode in (0, -signal.SIGINT, 2), output
    assert "run: stopped" in output
    assert "exited with" not in output, output
    # every child is gone: nothing is still listening on the API port
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{base}/healthz", timeout=1)


def _launch(tmp_path: Path, name: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    log_path = tmp_path / f"{name}.log"
    with log_path.open("wb") as log:
        launcher = subprocess.Popen(
            ["make", "-s", "run"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    return launcher, log_path


def _stop(launcher: subprocess.Popen[bytes]) -> None:
    if launcher.poll() is not None:
        return
    os.killpg(launcher.pid, signal.SIGINT)
    try:
        launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        raise


async def _delete_topology(amqp_url: str, prefix: str) -> None:
    topology = Topology(prefix)
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        for queue in [*topology.all_queue_names(), topology.owner_queue]:
            await channel.queue_delete(queue)
        for exchange in (topology.jobs_exchange, topology.dead_letter_exchange):
            await channel.exchange_delete(exchange)


def test_two_make_run_stacks_on_one_broker_keep_their_own_queues_and_both_pass_make_demo(
    amqp_url: str, tmp_path: Path
) -> None:
    base_env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "DATABASE_URL",
            "AUTH_JWT_SECRET",
            "TOKEN_ENCRYPTION_KEYS",
            "MAKEFLAGS",
            "AMQP_PREFIX",
        )
    }
    stacks: list[tuple[dict[str, str], subprocess.Popen[bytes], Path]] = []
    prefixes: list[str] = []
    try:
        # One after the other, as a user would: the second starts while the first runs.
        for name in ("first", "second"):
            env = {
                **base_env,
                "DATA_DIR": str(tmp_path / name / "data"),
                "API_PORT": str(infra.free_port()),
                "AMQP_URL": amqp_url,
            }
            launcher, log_path = _launch(tmp_path, name, env)
            stacks.append((env, launcher, log_path))
            base = f"http://127.0.0.1:{env['API_PORT']}"
            deadline = time.monotonic() + readme_start_up_seconds()
            while True:
                assert launcher.poll() is None, log_path.read_text()
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"no API:\n{log_path.read_text()}"
                time.sleep(0.2)  # poll interval, inside the deadline above
            found = re.search(r"run: AMQP_PREFIX=(\S+)", log_path.read_text())
            assert found, log_path.read_text()
            prefixes.append(found.group(1))
        assert prefixes[0] != prefixes[1]
        # Each stack's demo twice: the second run saves the same scrap again (a duplicate
        # whose analysis may still be running, or whose card exists) and passes too.
        for env, _, log_path in [stacks[0], stacks[1], stacks[0], stacks[1]]:
            demo = subprocess.run(
                ["make", "-s", "demo"], env=env, cwd=ROOT, capture_output=True, text=True,
                timeout=180,
            )  # fmt: skip
            assert demo.returncode == 0, demo.stdout + demo.stderr + log_path.read_text()[-4000:]
        for _, _, log_path in stacks:
            output = log_path.read_text()
            assert "another deployment" not in output, output[-4000:]
            assert "exited with" not in output, output[-4000:]
    finally:
        for _, launcher, _ in stacks:
            _stop(launcher)
        for prefix in prefixes:
            asyncio.run(_delete_topology(amqp_url, prefix))
