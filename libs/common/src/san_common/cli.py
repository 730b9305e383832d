"""What every console script shares: `--help` and `--version` from one parser factory, and
one readable line (never a traceback) when a dependency it needs cannot be reached.

    parser = cli.parser("san-relay", "The outbox relay.", distribution="san-relay")
    args = parser.parse_args(argv)            # --help / --version exit 0 here
    cli.run("san-relay", amain(settings))     # an unreachable dependency → one line, exit 1

A deployer reads that line in a crash-looping pod's log; an 80-line traceback of a refused
connection hides the one fact that matters: which server at which address.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiormq.exceptions import AMQPConnectionError
from sqlalchemy import exc as sa_exc

# Exit codes: 1 = a dependency is unreachable (retrying later may work), 2 = usage or
# configuration (retrying will not help).
EXIT_UNREACHABLE = 1
EXIT_USAGE = 2

# What a lost or refused connection looks like from each client library. Anything else
# escaping a service is a bug and keeps its traceback.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    AMQPConnectionError,
    ConnectionError,
    TimeoutError,
    socket.gaierror,
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
)
# At start-up, any socket error (no route, refused) means the same: not reachable.
STARTUP_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, OSError)


def version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"


def parser(prog: str, description: str, *, distribution: str) -> argparse.ArgumentParser:
    """An argument parser answering `--help` and `--version` (both exit 0)."""
    result = argparse.ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    result.add_argument("--version", action="version", version=f"{prog} {version(distribution)}")
    return result


def parse(
    prog: str, description: str, *, distribution: str, argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """For services that take no arguments besides `--help` and `--version`."""
    return parser(prog, description, distribution=distribution).parse_args(
        sys.argv[1:] if argv is None else argv
    )


def redact_url(url: str) -> str:
    """The URL with its password replaced, fit for a log line or an error message."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
    except ValueError:
        return "<unparseable URL>"


def describe(exc: BaseException) -> str:
    """`Type: message` of an exception and its causes, on one line."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = " ".join(str(current).split())
        if not parts or text not in parts[-1]:  # a wrapper repeating its cause says nothing
            parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__ or current.__context__
    return " ← ".join(parts)[:500]


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # not a platform uvloop supports: asyncio's own loop
        return None
    return uvloop.new_event_loop


class StartupFailure(SystemExit):
    """The process cannot start: one line on stderr — what is wrong, the setting that
    decides it and the fix — and a non-zero exit code. Never a traceback: the line is
    what a deployer reads in a crash-looping pod's log or a terminal."""

    def __init__(self, prog: str, message: str, code: int = EXIT_UNREACHABLE) -> None:
        print(f"{prog}: {' '.join(message.split())}", file=sys.stderr, flush=True)
        super().__init__(code)


class Unreachable(StartupFailure):
    """A dependency could not be reached at `url`, which `setting` names."""

    def __init__(
        self, prog: str, what: str, url: str, cause: BaseException, *, setting: str, fix: str
    ) -> None:
        super().__init__(
            prog, f"cannot reach {what} at {redact_url(url)} ({describe(cause)}): {fix} {setting}"
        )


def require_free_port(prog: str, setting: str, host: str, port: int) -> None:
    """Fail at once, before anything starts, when `host:port` cannot be listened on — not
    after every dependency is up, with the reason buried in a log."""
    if port == 0:  # any free port: nothing to check
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            # as the servers set it: a port whose old connections linger is not "in use"
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        reason = exc.strerror or describe(exc)
        raise StartupFailure(
            prog,
            f"cannot listen on {host}:{port} ({reason}): stop what is using it "
            f"or set {setting} to a free port",
        ) from None


class StartupRefused(Exception):
    """The service must not run as configured (its message says why and what to change):
    one line on stderr, exit code 2."""


def run(prog: str, main: Coroutine[Any, Any, object]) -> None:
    """`asyncio.run(main)` on uvloop where it is installed; a connection error or a refusal
    escaping it ends the process with one line."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main)
    except StartupRefused as exc:
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE) from None
    except CONNECTION_ERRORS as exc:
        print(f"{prog}: lost a connection it needs ({describe(exc)})", file=sys.stderr)
        raise SystemExit(EXIT_UNREACHABLE) from None
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        raise SystemExit(130) from None
