"""Run the services as separate OS processes, the way `make run` and deployments do."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

MODULES = {
    "api": "san_api.main",
    "relay": "san_relay.main",
    "ai-worker": "san_ai_worker.main",
    "github-worker": "san_github_worker.main",
    "recovery": "san_recovery.main",
}


@dataclass
class ServiceProcess:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(repr=False)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self, timeout: float = 30) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()


def start(
    name: str,
    env: dict[str, str],
    log_dir: Path,
    *,
    module: str | None = None,
    args: tuple[str, ...] = (),
) -> ServiceProcess:
    log_path = log_dir / f"{name}.log"
    handle = log_path.open("ab")
    popen = subprocess.Popen(
        [sys.executable, "-m", module or MODULES[name], *args],
        env={**os.environ, **env, "SERVICE_NAME": name},
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    handle.close()
    return ServiceProcess(name, popen, log_path, env)


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)  # poll interval, inside the deadline above
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_healthy(base_url: str, process: ServiceProcess, timeout: float = 90) -> None:
    def healthy() -> bool:
        if process.popen.poll() is not None:
            raise AssertionError(f"{process.name} exited early:\n{process.log()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200
        return False

    wait_until(healthy, timeout, f"{process.name} /healthz")


@contextlib.contextmanager
def running(processes: list[ServiceProcess]) -> Iterator[list[ServiceProcess]]:
    try:
        yield processes
    finally:
        for process in processes:
            process.terminate()
