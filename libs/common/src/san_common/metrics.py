"""Prometheus metrics shared by the services (each process exposes its own /metrics)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

JOBS_REGISTERED = Counter("san_jobs_registered_total", "Jobs registered", ["job_type"])
JOBS_FINISHED = Counter(
    "san_jobs_finished_total", "Jobs a worker finished, by outcome", ["job_type", "outcome"]
)
JOB_DURATION = Histogram(
    "san_job_duration_seconds",
    "Time from claim to COMPLETED/FAILED",
    ["job_type"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
JOB_QUEUE_WAIT = Histogram(
    "san_job_queue_wait_seconds",
    "Time from registration to the worker's claim",
    ["job_type"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300, 1800),
)
JOB_RETRIES = Counter("san_job_retries_total", "Transient failures retried", ["job_type"])
MESSAGES_SKIPPED = Counter(
    "san_messages_skipped_total", "Messages acked without work (job not claimable)", ["job_type"]
)
MESSAGES_DEAD_LETTERED = Counter(
    "san_messages_dead_lettered_total", "Messages rejected to the dead-letter queue", ["reason"]
)
OUTBOX_PUBLISHED = Counter("san_outbox_published_total", "Outbox messages confirmed by the broker")
OUTBOX_PUBLISH_FAILURES = Counter(
    "san_outbox_publish_failures_total", "Outbox messages the broker did not confirm"
)
# The API's direct publisher (san_common/broker/direct.py)
OUTBOX_DIRECT_PUBLISHED = Counter(
    "san_outbox_direct_published_total",
    "Outbox messages the API published itself, confirmed and marked",
)
OUTBOX_DIRECT_FALLBACKS = Counter(
    "san_outbox_direct_fallbacks_total",
    "Direct publishes that failed or were not confirmed: the relay publishes them",
)
OUTBOX_DIRECT_UNMARKED = Counter(
    "san_outbox_direct_unmarked_total",
    "Direct publishes confirmed but not marked: the relay publishes them again",
)
OUTBOX_BACKLOG = Gauge("san_outbox_backlog", "Unpublished outbox messages")
OUTBOX_OLDEST_AGE = Gauge(
    "san_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished outbox message"
)
OUTBOX_CLEANED = Counter("san_outbox_cleaned_total", "Published outbox rows deleted")

OUTBOX_PUBLISH_LAG = Histogram(
    "san_outbox_publish_lag_seconds",
    "Time from the outbox row's commit to the broker's confirm",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
QUEUE_MESSAGES = Gauge(
    "san_queue_messages_ready", "Messages ready in a broker queue (polled by the relay)", ["queue"]
)
# The scaling signal (services/recovery/.../runnable.py), which the KEDA triggers read.
QUEUE_RUNNABLE = Gauge(
    "san_queue_runnable_jobs",
    "Jobs of a queue a worker could run now: ready, due in the outbox or running; not those "
    "waiting for an upstream quota's or a budget's reset",
    ["queue"],
)
QUEUE_WAITING = Gauge(
    "san_queue_waiting_jobs",
    "PENDING jobs of a queue waiting for an upstream quota's or a budget's reset",
    ["queue"],
)

# Recovery sweeps (services/recovery); `sweep` is ghost, failed, orphans, unrefined, daily-til.
RECOVERY_JOBS_FOUND = Counter(
    "san_recovery_jobs_found_total", "Candidates a recovery sweep found", ["sweep", "job_type"]
)
RECOVERY_JOBS_REGISTERED = Counter(
    "san_recovery_jobs_registered_total",
    "Jobs a recovery sweep registered or re-registered",
    ["sweep", "job_type"],
)
RECOVERY_JOBS_GIVEN_UP = Counter(
    "san_recovery_jobs_given_up_total",
    "Jobs a recovery sweep stopped retrying (retry cap, target gone or complete)",
    ["sweep", "job_type"],
)
RECOVERY_SWEEP_RUNS = Counter(
    "san_recovery_sweep_runs_total",
    "Sweep runs by result (done, locked, error)",
    ["sweep", "result"],
)
RECOVERY_LAST_SUCCESS = Gauge(
    "san_recovery_last_success_timestamp_seconds", "When a sweep last ran to the end", ["sweep"]
)
# The maintenance service's stranded-message check (services/recovery/.../stranded.py).
STRANDED_REPUBLISHED = Counter(
    "san_stranded_republished_total",
    "PENDING jobs whose message was missing from their queue, re-published",
    ["job_type"],
)

# Results a worker holds through a database outage (san_common.worker.executor, "Held
# results"); how each hold ended: stored, fenced (its try no longer held the job), failed
# (its store raised, once the database answered), given_back (past WORKER_HOLD_SECONDS),
# over_cap (not held: WORKER_HELD_RESULTS were held already).
HELD_RESULTS = Gauge(
    "san_worker_held_results", "Job results held in memory until PostgreSQL answers"
)
RESULTS_HELD = Counter(
    "san_worker_results_held_total",
    "Job results whose store a database outage interrupted, by how the hold ended",
    ["job_type", "outcome"],
)
HOLD_OUTCOMES = ("stored", "fenced", "failed", "given_back", "over_cap")

JOB_OUTCOMES = ("completed", "failed", "lease_lost")
DEAD_LETTER_REASONS = ("unreadable", "version", "unroutable", "foreign", "unknown-job")


def init_worker_series(job_types: Iterable[str]) -> None:
    """Create a worker's labelled series at zero, so `/metrics` shows them before the first
    event and `rate()`/`increase()` alerts see the first failure as a change."""
    for job_type in job_types:
        for outcome in JOB_OUTCOMES:
            JOBS_FINISHED.labels(job_type, outcome)
        JOB_RETRIES.labels(job_type)
        MESSAGES_SKIPPED.labels(job_type)
        JOB_DURATION.labels(job_type)
        JOB_QUEUE_WAIT.labels(job_type)
        for how in HOLD_OUTCOMES:
            RESULTS_HELD.labels(job_type, how)
    for reason in DEAD_LETTER_REASONS:
        MESSAGES_DEAD_LETTERED.labels(reason)


# The AI usage ledger (san_common.usage): what the calls of each model and job type cost.
AI_TOKENS = Counter(
    "san_ai_tokens_total", "Tokens of answered AI calls", ["model", "job_type", "kind"]
)
AI_COST = Counter(
    "san_ai_cost_usd_total", "Cost of answered AI calls (AI_PRICES)", ["model", "job_type"]
)
