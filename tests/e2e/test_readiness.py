"""Readiness that matches the outbox (docs/reference/job-rules.md §7), with the services as OS
processes and their broker behind a proxy this test cuts: the API stays ready and keeps accepting
scraps while the broker is away (its body says `broker: down`), the worker is not ready until its
own consumer is back, the relay needs both — and no probe opens a broker connection."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from san_api.auth.tokens import mint
from san_common.broker.topology import Topology
from tests import infra
from tests.conftest import JWT_SECRET
from tests.procs import ServiceProcess, running, start, wait_healthy, wait_until
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]

PROBE_CALLS = 50


def _ready(url: str) -> tuple[int, dict[str, object]]:
    response = httpx.get(f"{url}/readyz", timeout=5)
    return response.status_code, response.json()


def _until(check: Callable[[], bool], what: str, processes: list[ServiceProcess]) -> None:
    def alive_and(check_: Callable[[], bool] = check) -> bool:
        for process in processes:
            assert process.popen.poll() is None, f"{process.name} died:\n{process.log()[-3000:]}"
        try:
            return check_()
        except httpx.HTTPError:
            return False

    wait_until(alive_and, 60, what, interval=0.2)


def test_probes_follow_each_services_own_job_through_a_broker_outage(
    stack_env: dict[str, str], amqp_url: str, topology: Topology, tmp_path: Path
) -> None:
    with TcpProxy(amqp_url) as proxy:
        env = {**stack_env, "AMQP_URL": proxy.url}
        ports = {"ai-worker": infra.free_port(), "relay": infra.free_port()}
        api_url = f"http://127.0.0.1:{env['API_PORT']}"
        urls = {"api": api_url, **{n: f"http://127.0.0.1:{p}" for n, p in ports.items()}}
        processes = [start("api", env, tmp_path)] + [
            start(name, {**env, "PROBE_PORT": str(port)}, tmp_path) for name, port in ports.items()
        ]
        with running(processes):
            for process in processes:
                wait_healthy(urls[process.name], process, timeout=60)
            for name, url in urls.items():
                _until(lambda u=url: _ready(u)[0] == 200, f"{name} ready", processes)
            _until(lambda: _ready(api_url)[1]["checks"] == {"database": "up", "broker": "up"},
                   "the API to see the broker", processes)  # fmt: skip

            opened = proxy.accepted
            for url in urls.values():
                for _ in range(PROBE_CALLS):
                    assert _ready(url)[0] == 200
            assert proxy.accepted == opened, "a readiness probe opened a broker connection"

            proxy.cut()
            _until(lambda: _ready(urls["ai-worker"])[0] == 503, "the worker unready", processes)
            _until(lambda: _ready(urls["relay"])[0] == 503, "the relay unready", processes)
            status, body = _ready(api_url)
            assert status == 200, body
            _until(lambda: _ready(api_url)[1]["checks"]["broker"] == "down",
                   "the API to report the broker down", processes)  # fmt: skip
            assert _ready(api_url)[0] == 200
            worker_body = _ready(urls["ai-worker"])[1]
            assert worker_body["checks"] == {"database": "up", "consumer": "down"}, worker_body

            headers = {"Authorization": f"Bearer {mint(JWT_SECRET, 'outage-user')}"}
            with httpx.Client(base_url=api_url, headers=headers, timeout=10) as client:
                accepted = client.post("/scraps", json={"content": "Saved while RabbitMQ is away."})
                assert accepted.status_code == 202, accepted.text
                job_id = accepted.json()["analysisJobId"]

                proxy.restore()
                _until(lambda: _ready(urls["ai-worker"])[0] == 200,
                       "the worker's consumer back", processes)  # fmt: skip
                _until(lambda: _ready(urls["relay"])[0] == 200, "the relay back", processes)
                _until(lambda: _ready(api_url)[1]["checks"]["broker"] == "up",
                       "the API to see the broker again", processes)  # fmt: skip

                def completed() -> bool:
                    status = client.get(f"/async-jobs/{job_id}").json()["status"]
                    assert status != "FAILED"
                    return bool(status == "COMPLETED")

                _until(completed, "the scrap accepted during the outage to be processed", processes)
