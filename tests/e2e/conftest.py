from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from san_api.auth.tokens import mint
from san_common.broker.topology import Topology
from tests import infra
from tests.conftest import JWT_SECRET
from tests.procs import ServiceProcess, start, wait_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]


@dataclass
class Stack:
    env: dict[str, str]
    log_dir: Path
    base_url: str
    processes: list[ServiceProcess]

    def start(self, name: str, **kw: object) -> ServiceProcess:
        process = start(name, self.env, self.log_dir, **kw)  # type: ignore[arg-type]
        self.processes.append(process)
        return process

    def headers(self, subject: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()[-4000:]}" for p in self.processes)

    def wait_job(
        self, client: httpx.Client, headers: dict[str, str], job_id: str, timeout: float = 60
    ) -> dict:  # type: ignore[type-arg]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = client.get(f"/async-jobs/{job_id}", headers=headers).json()
            if job["status"] in ("COMPLETED", "FAILED"):
                return job  # type: ignore[no-any-return]
            time.sleep(0.1)  # poll interval, inside the deadline above
        raise AssertionError(f"job {job_id} did not finish: {job}\n{self.logs()}")


@pytest.fixture
def stack_env(
    fresh_db_url: str, amqp_url: str, topology: Topology, tmp_path: Path
) -> dict[str, str]:
    return {
        "DATABASE_URL": fresh_db_url,
        "AMQP_URL": amqp_url,
        "AMQP_PREFIX": topology.prefix,
        "AUTH_JWT_SECRET": JWT_SECRET,
        "API_HOST": "127.0.0.1",
        "API_PORT": str(infra.free_port()),
        "AI_PROVIDER": "local",
        "LOG_FORMAT": "json",
        "SAN_ENV": "test",
        "DATA_DIR": str(tmp_path / "data"),
        "WORKER_BACKOFF_SECONDS": "0.05",
    }


@pytest.fixture
def stack(stack_env: dict[str, str], tmp_path: Path) -> Iterator[Stack]:
    """An API process; tests start the other services they need."""
    base_url = f"http://127.0.0.1:{stack_env['API_PORT']}"
    stack = Stack(stack_env, tmp_path, base_url, [])
    api = stack.start("api")
    try:
        wait_healthy(base_url, api)
        yield stack
    finally:
        for process in reversed(stack.processes):
            process.terminate()


StackFactory = Callable[[], Stack]
