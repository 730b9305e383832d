from __future__ import annotations

from enum import StrEnum


class JobType(StrEnum):
    CARD_ANALYSIS = "CARD_ANALYSIS"
    SCRAP_REFINE = "SCRAP_REFINE"
    TIL_GENERATION = "TIL_GENERATION"
    TIL_GITHUB_COMMIT = "TIL_GITHUB_COMMIT"
    RECALL_QUIZ_GENERATION = "RECALL_QUIZ_GENERATION"
    GITHUB_STAR_RECOMMENDATION = "GITHUB_STAR_RECOMMENDATION"


class JobStatus(StrEnum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"  # by an operator; terminal, never claimed by a worker


ACTIVE_STATUSES = (JobStatus.PENDING, JobStatus.PROCESSING)
TERMINAL_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)

# Which worker consumes which job type (docs/reference/job-rules.md §2.1); separate pools so GitHub
# slowness never starves AI jobs.
AI_JOB_TYPES = frozenset(
    {
        JobType.CARD_ANALYSIS,
        JobType.SCRAP_REFINE,
        JobType.TIL_GENERATION,
        JobType.RECALL_QUIZ_GENERATION,
        JobType.GITHUB_STAR_RECOMMENDATION,
    }
)
GITHUB_JOB_TYPES = frozenset({JobType.TIL_GITHUB_COMMIT})
