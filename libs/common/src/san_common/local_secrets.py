"""Secrets for local runs: generated once into the data directory and reused, so a
developer needs no configuration. Production settings refuse to fall back to these."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

PLACEHOLDERS = frozenset({"", "changeme", "change-me", "secret", "dev", "test", "example"})


def local_secret(
    data_dir: Path, name: str, make: Callable[[], str] = lambda: secrets.token_urlsafe(48)
) -> str:
    path = data_dir / "secrets" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        # O_EXCL: two processes starting together agree on one secret.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(make())
    for _ in range(50):
        value = path.read_text().strip()
        if value:
            return value
        # the creating process has not written it yet
        time.sleep(0.01)
    raise RuntimeError(f"local secret {path} is empty")
