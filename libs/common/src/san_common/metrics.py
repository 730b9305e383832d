"""Prometheus metrics shared by the services (each process exposes its own /metrics)."""

from __future__ import annotations

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
OUTBOX_BACKLOG = Gauge("san_outbox_backlog", "Unpublished outbox messages")
OUTBOX_OLDEST_AGE = Gauge(
    "san_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished outbox message"
)
OUTBOX_CLEANED = Counter("san_outbox_cleaned_total", "Published outbox rows deleted")

