"""The real relay, except that it SIGKILLs itself the first time it is about to mark rows
published — i.e. after the broker confirmed the batch, before the database learns of it."""

from __future__ import annotations

import os
import signal

from san_relay import main, repository

_original = repository.mark_published


async def _die_before_marking(session, ids):  # type: ignore[no-untyped-def]
    if ids:
        os.kill(os.getpid(), signal.SIGKILL)
    await _original(session, ids)


repository.mark_published = _die_before_marking  # type: ignore[assignment]

if __name__ == "__main__":
    main.main()
