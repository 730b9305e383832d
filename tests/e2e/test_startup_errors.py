"""Start-up faults as a deployer meets them: every service, `san-migrate` and `make run` stop
with exit code ≠ 0 and exactly ONE line on stderr that names the setting to change and how
— never a traceback — for an unreachable database, refused credentials, a malformed URL, a
busy port, an unreachable broker and a database without pgvector.

`make` adds its own trailer when a recipe fails (`make: *** [Makefile:…: run] Error 1`);
that line is make's, not SAN's, and is the one line not counted."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from san_common.db.engine import plain_url
from tests import infra
from tests.conftest import JWT_SECRET, TOKEN_KEYS, _admin
from tests.deploy.services import ROOT

pytestmark = [pytest.mark.e2e]

# Each service as a deployment starts it.
SERVICES = {
    "san-api": ["san-api"],
    "san-relay": ["san-relay"],
    "san-ai-worker": ["san-ai-worker"],
    "san-github-worker": ["san-github-worker"],
    "san-recovery": ["san-recovery", "serve"],
}
WITH_MIGRATE = {**SERVICES, "san-migrate": ["san-migrate"]}
NEEDS_BROKER = ["san-relay", "san-ai-worker", "san-github-worker"]
PROBED = ["san-relay", "san-ai-worker", "san-github-worker", "san-recovery"]
MAKE_TRAILER = re.compile(r"^make(\[\d+\])?: \*\*\* ")
SECRET = "hunter2-secret"


def _script(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _run(
    args: list[str], env: dict[str, str], *, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_", "AMQP_", "API_", "PROBE_", "MAKEFLAGS", "MAKELEVEL"))
    }
    return subprocess.run(
        args, env={**base, **env}, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def one_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The run failed with exactly one line on stderr (make's trailer aside); it is
    returned after checking it names each of `needles` and leaks no password."""
    assert result.returncode != 0, (result.returncode, result.stdout, result.stderr)
    lines = [
        line for line in result.stderr.splitlines() if line.strip() and not MAKE_TRAILER.match(line)
    ]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert SECRET not in result.stderr, "the password stays out of the message"
    return lines[0]


@pytest.fixture
def base_env(tmp_path: Path) -> dict[str, str]:
    return {
        "DATA_DIR": str(tmp_path / "data"),
        "AUTH_JWT_SECRET": JWT_SECRET,
        "TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS,
        "AMQP_PREFIX": infra.unique_name("santest"),
        "API_PORT": str(infra.free_port()),
    }


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.fixture
async def no_pgvector_db_url(pg_server: str) -> AsyncIterator[str]:
    """A database on a server that, for it, has no pgvector to offer: PostgreSQL 18's
    `extension_control_path` pointed at an empty directory, as a server without the
    extension installed looks."""
    connection = await asyncpg.connect(plain_url(infra.with_database(pg_server, "postgres")))
    try:
        version = int(await connection.fetchval("SHOW server_version_num"))
    finally:
        await connection.close()
    if version < 180000:
        pytest.skip("needs PostgreSQL 18's extension_control_path")
    name = infra.unique_name("san_novector")
    await _admin(pg_server, f'CREATE DATABASE "{name}"')
    await _admin(pg_server, f"ALTER DATABASE \"{name}\" SET extension_control_path = '/nowhere'")
    yield infra.with_database(pg_server, name)
    await _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _unreachable_db() -> str:
    return f"postgresql://san:{SECRET}@127.0.0.1:{infra.free_port()}/san"


def _wrong_user(pg_server: str) -> str:
    url = make_url(infra.with_database(pg_server, "postgres"))
    return url.set(username="no_such_role", password=SECRET).render_as_string(hide_password=False)


@pytest.mark.parametrize("script", sorted(WITH_MIGRATE))
def test_an_unreachable_database_is_one_line(script: str, base_env: dict[str, str]) -> None:
    result = _run(
        [_script(WITH_MIGRATE[script][0]), *WITH_MIGRATE[script][1:]],
        {**base_env, "DATABASE_URL": _unreachable_db()},
    )
    one_line(result, f"{script}: cannot reach PostgreSQL", "127.0.0.1", "DATABASE_URL")


@pytest.mark.parametrize("script", sorted(WITH_MIGRATE))
def test_refused_credentials_are_one_line(
    script: str, base_env: dict[str, str], pg_server: str
) -> None:
    result = _run(
        [_script(WITH_MIGRATE[script][0]), *WITH_MIGRATE[script][1:]],
        {**base_env, "DATABASE_URL": _wrong_user(pg_server)},
    )
    one_line(result, f"{script}: ", "refused the login", "no_such_role", "DATABASE_URL")


@pytest.mark.parametrize("script", sorted(WITH_MIGRATE))
@pytest.mark.parametrize(
    "url", ["postgres//san:hunter2-secret@db/san", "postgresql://san@db:port/san"]
)
def test_a_malformed_database_url_is_one_line(
    script: str, url: str, base_env: dict[str, str]
) -> None:
    result = _run(
        [_script(WITH_MIGRATE[script][0]), *WITH_MIGRATE[script][1:]],
        {**base_env, "DATABASE_URL": url},
    )
    assert result.returncode == 2, result.stderr
    one_line(result, "DATABASE_URL", "expected postgresql://")


@pytest.mark.parametrize("script", NEEDS_BROKER)
def test_a_malformed_broker_url_is_one_line(
    script: str, base_env: dict[str, str], db_url: str
) -> None:
    result = _run([_script(script)], {**base_env, "DATABASE_URL": db_url, "AMQP_URL": "amqp//x"})
    one_line(result, "AMQP_URL", "expected amqp://")


@pytest.mark.parametrize("script", NEEDS_BROKER)
def test_an_unreachable_broker_is_one_line(
    script: str, base_env: dict[str, str], db_url: str
) -> None:
    nowhere = f"amqp://san:{SECRET}@127.0.0.1:{infra.free_port()}/"
    result = _run([_script(script)], {**base_env, "DATABASE_URL": db_url, "AMQP_URL": nowhere})
    one_line(result, f"{script}: cannot reach RabbitMQ", "127.0.0.1", "AMQP_URL")


@pytest.mark.parametrize("script", sorted(WITH_MIGRATE))
def test_a_database_without_pgvector_is_one_line(
    script: str, base_env: dict[str, str], no_pgvector_db_url: str
) -> None:
    result = _run(
        [_script(WITH_MIGRATE[script][0]), *WITH_MIGRATE[script][1:]],
        {**base_env, "DATABASE_URL": no_pgvector_db_url},
    )
    one_line(result, f"{script}: ", "without pgvector", "install pgvector")


def test_the_api_on_a_busy_port_is_one_line(
    base_env: dict[str, str], db_url: str, busy_port: int
) -> None:
    result = _run(
        [_script("san-api")], {**base_env, "DATABASE_URL": db_url, "API_PORT": str(busy_port)}
    )
    one_line(result, "san-api: cannot listen on", str(busy_port), "API_PORT")


@pytest.mark.rabbit
@pytest.mark.parametrize("script", PROBED)
def test_a_service_on_a_busy_probe_port_is_one_line(
    script: str, base_env: dict[str, str], db_url: str, amqp_url: str, busy_port: int
) -> None:
    env = {**base_env, "DATABASE_URL": db_url, "AMQP_URL": amqp_url}
    result = _run([_script(script), *SERVICES[script][1:]], {**env, "PROBE_PORT": str(busy_port)})
    one_line(result, f"{script}: cannot listen on", str(busy_port), "PROBE_PORT")


# -- make run: the same faults, caught before any service starts ------------------------------


def _make_run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _run(["make", "-s", "run"], env, cwd=ROOT, timeout=180)


@pytest.mark.rabbit
def test_make_run_on_a_busy_port_fails_fast_with_one_line(
    base_env: dict[str, str], amqp_url: str, busy_port: int
) -> None:
    result = _make_run({**base_env, "AMQP_URL": amqp_url, "API_PORT": str(busy_port)})
    one_line(result, "run: cannot listen on", str(busy_port), "API_PORT")
    assert "started" not in result.stdout and "embedded PostgreSQL" not in result.stdout


@pytest.mark.rabbit
@pytest.mark.parametrize("fault", ["unreachable", "credentials", "malformed", "no pgvector"])
def test_make_run_with_a_database_fault_is_one_line(
    fault: str,
    base_env: dict[str, str],
    amqp_url: str,
    pg_server: str,
    request: pytest.FixtureRequest,
) -> None:
    url = {
        "unreachable": _unreachable_db,
        "credentials": lambda: _wrong_user(pg_server),
        "malformed": lambda: "postgres//san:hunter2-secret@db/san",
        "no pgvector": lambda: request.getfixturevalue("no_pgvector_db_url"),
    }[fault]()
    result = _make_run({**base_env, "AMQP_URL": amqp_url, "DATABASE_URL": url})
    one_line(result, "DATABASE_URL" if fault != "no pgvector" else "pgvector")
    assert "started" not in result.stdout


def test_make_run_with_an_unreachable_remote_broker_is_one_line(base_env: dict[str, str]) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never routed, and not this machine, so nothing is started
    result = _make_run({**base_env, "AMQP_URL": f"amqp://san:{SECRET}@192.0.2.1:5672/"})
    one_line(result, "run: no RabbitMQ answers at AMQP_URL", "192.0.2.1")
