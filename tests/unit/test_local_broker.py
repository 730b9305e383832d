"""The broker `make run` starts is stopped when `make run` stops; one it found running is
left alone. `rabbitmq-server` and `rabbitmqctl` are stand-ins on PATH here (starting and
stopping the machine's real broker would take it from everyone sharing it): the first
listens on RABBITMQ_NODE_PORT in the background, as `-detached` does, the second stops it."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from dev.local_broker import ensure_rabbitmq, port_open, stop_rabbitmq
from tests import infra

pytestmark = pytest.mark.unit

SERVER = """#!{python}
import os, socket, subprocess, sys
port = int(os.environ["RABBITMQ_NODE_PORT"])
child = subprocess.Popen([sys.executable, "-c", '''
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
while True:
    s.accept()[0].close()
''', str(port)], start_new_session=True)
open({pidfile!r}, "w").write(str(child.pid))
"""
CTL = """#!{python}
import os, signal, sys
assert sys.argv[1:] == ["stop"], sys.argv
os.kill(int(open({pidfile!r}).read()), signal.SIGTERM)
"""


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pidfile = tmp_path / "broker.pid"
    for name, body in (("rabbitmq-server", SERVER), ("rabbitmqctl", CTL)):
        script = tmp_path / name
        script.write_text(body.format(python=sys.executable, pidfile=str(pidfile)))
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return pidfile


def test_a_broker_it_started_is_reported_and_stopped(stand_ins: Path) -> None:
    port = infra.free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    assert ensure_rabbitmq(url, timeout=20) is True, "started here"
    assert port_open("127.0.0.1", port)
    stop_rabbitmq(url)
    pid = int(stand_ins.read_text())
    assert _gone(pid), "the broker it started outlives make run"


def test_a_broker_already_running_is_not_its_own(stand_ins: Path) -> None:
    with socket.socket() as running:
        running.bind(("127.0.0.1", 0))
        running.listen()
        port = running.getsockname()[1]
        assert ensure_rabbitmq(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=5) is False
    assert not stand_ins.exists(), "nothing was started"


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)  # poll interval, inside the deadline above
    return False
