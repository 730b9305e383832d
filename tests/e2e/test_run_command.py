"""The README's run command (`make run` → dev/run_local.py) on its embedded defaults:
no DATABASE_URL, no secrets — it must start everything, serve a scrap end to end, and stop
every process on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from san_common.broker.topology import Topology
from tests import infra
from tests.procs import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]

ROOT = Path(__file__).resolve().parents[2]


def test_run_command_serves_a_scrap_end_to_end_and_stops_on_ctrl_c(
    amqp_url: str, topology: Topology, tmp_path: Path
) -> None:
    port = infra.free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "AUTH_JWT_SECRET", "TOKEN_ENCRYPTION_KEYS")
    }
    env.update(
        DATA_DIR=str(tmp_path / "data"),
        API_PORT=str(port),
        AMQP_URL=amqp_url,
        AMQP_PREFIX=topology.prefix,  # the fixture deletes its queues afterwards
    )
    log_path = tmp_path / "run.log"
    with log_path.open("wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, str(ROOT / "dev" / "run_local.py")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert launcher.poll() is None, log_path.read_text()
            try:
                return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 90, "the API of `make run`")
        token = subprocess.run(
            [sys.executable, "-m", "san_api.auth.mint", "run-user"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as client:
            accepted = client.post("/scraps", json={"content": "Embedded defaults just work."})
            assert accepted.status_code == 202, accepted.text
            body = accepted.json()

            def completed() -> bool:
                status = client.get(f"/async-jobs/{body['analysisJobId']}").json()["status"]
                assert status != "FAILED", log_path.read_text()
                return status == "COMPLETED"

            wait_until(completed, 60, "the CARD_ANALYSIS job")
            assert client.get(f"/cards/{body['scrapId']}").status_code == 200
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            raise
    output = log_path.read_text()
    assert launcher.returncode == 0, output
    assert "run: stopped" in output
    # every child is gone: nothing is still listening on the API port
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{base}/healthz", timeout=1)
