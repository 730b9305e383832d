from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class Policy:
    """What the sweeps decide with; built from `RecoverySettings`, or directly in tests."""

    pending_after: timedelta = timedelta(minutes=30)
    processing_after: timedelta = timedelta(hours=1)
    lease_grace: timedelta = timedelta(seconds=60)
    orphan_grace: timedelta = timedelta(minutes=10)
    max_reregistrations: int = 3
    batch_size: int = 500
    til_lookback_days: int = 1
    # Retention: terminal jobs older than this (by finished_at) are deleted.
    keep_completed: timedelta = timedelta(days=14)
    keep_failed: timedelta = timedelta(days=30)  # FAILED and CANCELLED

    @property
    def max_attempt(self) -> int:
        """`attempt` is 1 for a first registration and +1 per re-registration, so a
        chain that reached this attempt has used up its re-registrations."""
        return 1 + self.max_reregistrations
