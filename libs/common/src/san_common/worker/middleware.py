"""Cross-cutting concerns around each job's execution, as middleware (outermost first):
tracing (a consumer span continuing the relay's publish span), log context (`job_id`,
`job_type`, `message_id`, `trace_id` on every line), metrics and the one INFO line per job
outcome."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from san_common import metrics, tracing
from san_common.jobs.envelope import JobMessage
from san_common.logs import log_context
from san_common.worker.executor import JobContext, Middleware, Next, Outcome

log = logging.getLogger("san_common.worker")

# Outcomes that settle the job (the rest leave it to a later delivery).
_FINISHED = {Outcome.COMPLETED, Outcome.FAILED, Outcome.LEASE_LOST}


async def trace(context: JobContext, call: Next) -> Outcome:
    envelope = context.envelope
    carrier = trace_carrier(envelope, context.delivery.headers)
    with tracing.span(
        f"process {envelope.job_type}",
        kind="consumer",
        parent=carrier,
        attributes={
            "san.job_id": str(envelope.job_id),
            "messaging.message.id": str(envelope.message_id),
        },
    ):
        context.fields["_trace_id"] = tracing.current_trace_id() or tracing.trace_id_of(
            carrier.get("traceparent")
        )
        outcome = await call()
        tracing.annotate(outcome=outcome.value, attempt=envelope.attempt)
        return outcome


async def bind_log_context(context: JobContext, call: Next) -> Outcome:
    envelope = context.envelope
    with log_context(
        job_id=envelope.job_id,
        job_type=envelope.job_type,
        message_id=envelope.message_id,
        trace_id=context.fields.pop("_trace_id", None),
    ):
        return await call()


async def measure(context: JobContext, call: Next) -> Outcome:
    """Metrics, and one INFO line per outcome ("job completed", "job skipped", …)."""
    job_type = context.envelope.job_type
    started = time.monotonic()
    outcome = await call()
    claim = context.claim
    if claim is not None:
        wait = (datetime.now(UTC) - context.envelope.created_at).total_seconds()
        metrics.JOB_QUEUE_WAIT.labels(job_type).observe(max(0.0, wait))
    if outcome in _FINISHED:
        metrics.JOBS_FINISHED.labels(job_type, outcome.value).inc()
        metrics.JOB_DURATION.labels(job_type).observe(time.monotonic() - started)
    elif outcome in (Outcome.RETRY, Outcome.RATE_LIMITED):
        metrics.JOB_RETRIES.labels(job_type).inc()
    elif outcome in (Outcome.SKIPPED, Outcome.DEFERRED):
        metrics.MESSAGES_SKIPPED.labels(job_type).inc()
    fields = {
        "outcome": outcome.value,
        "ms": round((time.monotonic() - started) * 1000, 1),
        **({"try": claim.try_no} if claim is not None else {}),
        **{k: v.isoformat() if isinstance(v, datetime) else v for k, v in context.fields.items()},
    }
    level = logging.WARNING if outcome in (Outcome.FAILED, Outcome.LEASE_LOST) else logging.INFO
    log.log(level, "job %s", outcome.value, extra={"fields": fields})
    return outcome


DEFAULT_MIDDLEWARE: tuple[Middleware, ...] = (trace, bind_log_context, measure)


def trace_carrier(envelope: JobMessage, headers: object) -> dict[str, str]:
    """The trace context to continue: the relay's publish span (message headers) when the
    relay traced, else the registering request's (the envelope)."""
    values = headers if isinstance(headers, dict) else {}
    if values.get("traceparent"):
        raw = {k: values.get(k) for k in ("traceparent", "tracestate")}
    else:
        raw = {"traceparent": envelope.traceparent, "tracestate": envelope.tracestate}
    return {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in raw.items() if v}
