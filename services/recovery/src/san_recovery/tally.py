"""What a sweep did, counted per job type."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    REGISTERED = "registered"
    GIVEN_UP = "given_up"
    # Someone else did it (a unique-index conflict, a TIL already in progress): not an error.
    SKIPPED = "skipped"
    ERROR = "error"
    PRUNED = "pruned"  # retention deleted it


@dataclass
class Counts:
    found: int = 0
    registered: int = 0
    given_up: int = 0
    skipped: int = 0
    errors: int = 0
    pruned: int = 0

    def add(self, other: Counts) -> None:
        self.found += other.found
        self.registered += other.registered
        self.given_up += other.given_up
        self.skipped += other.skipped
        self.errors += other.errors
        self.pruned += other.pruned

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Tally:
    by_type: dict[str, Counts] = field(default_factory=dict)

    def _counts(self, job_type: str) -> Counts:
        return self.by_type.setdefault(job_type, Counts())

    def found(self, job_type: str) -> None:
        self._counts(job_type).found += 1

    def record(self, job_type: str, outcome: Outcome) -> None:
        counts = self._counts(job_type)
        match outcome:
            case Outcome.REGISTERED:
                counts.registered += 1
            case Outcome.GIVEN_UP:
                counts.given_up += 1
            case Outcome.SKIPPED:
                counts.skipped += 1
            case Outcome.ERROR:
                counts.errors += 1
            case Outcome.PRUNED:
                counts.pruned += 1

    def merge(self, other: Tally) -> None:
        for job_type, counts in other.by_type.items():
            self._counts(job_type).add(counts)

    @property
    def total(self) -> Counts:
        total = Counts()
        for counts in self.by_type.values():
            total.add(counts)
        return total

    @property
    def progress(self) -> int:
        """Candidates this tally settled for good; a batch without any ends the run."""
        total = self.total
        return total.registered + total.given_up + total.pruned
