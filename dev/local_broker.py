"""A RabbitMQ for local runs and the test suite: the one `AMQP_URL` names, started from the
machine's `rabbitmq-server` when it points at this machine and nothing answers there."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from urllib.parse import urlsplit, urlunsplit

DEFAULT_AMQP_URL = "amqp://guest:guest@localhost:5672/"
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


class BrokerUnavailable(RuntimeError):
    """No broker answers at the URL and none could be started: the message says what to do."""


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or 5672


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host, port = address(url)
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}:{port}"))


def ensure_rabbitmq(url: str = DEFAULT_AMQP_URL, timeout: float = 60.0) -> bool:
    """Return once something listens at `url`'s host and port — True when this call
    started it (`rabbitmq-server` on that port, if the URL is local and it is installed),
    False when it was already running; else raise BrokerUnavailable."""
    host, port = address(url)
    if port_open(host, port):
        return False
    how = (
        "start one (`rabbitmq-server -detached`, or "
        f"`docker run -d -p {port}:5672 rabbitmq:3.13-management`) or set AMQP_URL"
    )
    if host not in LOCAL_HOSTS or shutil.which("rabbitmq-server") is None:
        raise BrokerUnavailable(f"no RabbitMQ answers at AMQP_URL={redacted(url)}: {how}")
    subprocess.run(
        ["rabbitmq-server", "-detached"],
        check=False,
        env={**os.environ, "RABBITMQ_NODE_PORT": str(port)},
    )
    deadline = time.monotonic() + timeout
    while not port_open(host, port):
        if time.monotonic() > deadline:
            raise BrokerUnavailable(
                f"rabbitmq-server did not open port {port} of AMQP_URL={redacted(url)} "
                f"within {timeout:.0f}s: {how}"
            )
        time.sleep(0.5)  # poll interval, inside the deadline above
    return True


def stop_rabbitmq(url: str = DEFAULT_AMQP_URL) -> None:
    """Stop the node `ensure_rabbitmq` started for `url` (`-detached` outlives its parent).
    A broker that was already running is never passed here: it is someone else's."""
    _, port = address(url)
    subprocess.run(
        ["rabbitmqctl", "stop"],
        check=False,
        env={**os.environ, "RABBITMQ_NODE_PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=60,
    )


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
