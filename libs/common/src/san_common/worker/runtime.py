"""Consume job messages, claim the job, run its handler, settle the job, then ack.

Per message:
1. parse the envelope — unreadable → reject to the dead-letter queue;
2. claim the job (PENDING → PROCESSING with a lease) — not claimable → ack and skip;
3. `load` (short transaction), `run` (no transaction; transient errors retried with
   backoff), `store` + COMPLETED (one transaction), or FAILED with the cause chain;
4. ack. The ack comes last, so a crash anywhere before it redelivers the message, and the
   claim makes that redelivery harmless.
A database outage is not the job's fault: after a backoff that grows with the message's
delivery count, the job is released (best effort) and the message requeued; a redelivery
to this worker may take back its own unfinished job, one to another worker can once the
job is released or its lease expires. The quorum queue's delivery limit dead-letters a
message whose outage outlasts every retry; the job is then found by the ghost sweep.
Two deliveries of one job to this worker at once are told apart in memory: the second
is acked and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aio_pika
import httpx
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from pydantic import ValidationError
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common import metrics, tracing
from san_common.broker.monitor import connection_is_open
from san_common.broker.topology import Topology, declare_topology
from san_common.errors import PermanentJobError, TransientJobError, cause_chain
from san_common.jobs import repository as jobs
from san_common.jobs.envelope import ENVELOPE_VERSION, JobMessage
from san_common.jobs.types import JobType
from san_common.logs import log_context
from san_common.models import AsyncJob
from san_common.worker.handler import FailureHook, JobHandler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeConfig:
    prefetch: int = 10
    lease_seconds: float = 120.0
    max_tries: int = 3
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0
    drain_seconds: float = 30.0
    # Waits the remote side asked for (`retry_after`, i.e. rate limits) do not spend
    # `max_tries`, up to this many per run; a wait longer than `max_retry_after_seconds`
    # fails the job instead (the recovery sweep re-registers it later).
    rate_limit_waits: int = 5
    max_retry_after_seconds: float = 900.0


class _LeaseLost(Exception):
    """Another worker took the job over (our lease expired); our result is discarded."""


# The database (or its network) failing under us — not the job's fault, so not its outcome.
# OSError covers sockets and timeouts; handlers' external calls raise JobFailure or httpx
# errors instead, which `_run_with_retries` and `_settle` classify.
_INFRA_ERRORS = (sa_exc.OperationalError, sa_exc.InterfaceError, OSError)


class WorkerRuntime:
    def __init__(
        self,
        *,
        session_factory: async_sessionmaker[AsyncSession],
        amqp_url: str,
        topology: Topology,
        handlers: Mapping[JobType, JobHandler],
        config: RuntimeConfig = RuntimeConfig(),
        worker_id: str | None = None,
    ) -> None:
        self._sessions = session_factory
        self._amqp_url = amqp_url
        self._topology = topology
        self._handlers = dict(handlers)
        self._config = config
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._inflight: set[asyncio.Task[None]] = set()
        self._active: set[uuid.UUID] = set()  # jobs this process is working on
        self._lease = timedelta(seconds=config.lease_seconds)
        self.connected = asyncio.Event()
        # Readiness hook (deploy): what `consuming()` reads; no probe touches the broker.
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractChannel | None = None
        self._consuming = False
        metrics.init_worker_series(t.value for t in self._handlers)

    def consuming(self) -> bool:
        """Ready (SPEC §7): this worker's consumer connection and channel are open and its
        consumers registered; false while aio_pika reconnects and once draining starts."""
        return (
            self._consuming
            and connection_is_open(self._connection)
            and self._channel is not None
            and not self._channel.is_closed
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until `stop` is set, then drain: take nothing new, let in-flight jobs
        finish for up to `drain_seconds`, release the rest back to PENDING and requeue."""
        connection = await aio_pika.connect_robust(self._amqp_url)
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self._config.prefetch)
            queues = await declare_topology(channel, self._topology)
            consumers: list[tuple[AbstractQueue, str]] = []
            for job_type in self._handlers:
                queue = queues[job_type]
                consumers.append((queue, await queue.consume(self._on_message)))
            log.info(
                "worker consuming",
                extra={
                    "fields": {
                        "worker_id": self.worker_id,
                        "queues": [q.name for q, _ in consumers],
                    }
                },
            )
            self._connection, self._channel, self._consuming = connection, channel, True
            self.connected.set()
            await stop.wait()
            self._consuming = False
            log.info("worker draining", extra={"fields": {"in_flight": len(self._inflight)}})
            for queue, tag in consumers:
                await queue.cancel(tag)
            await self._drain()
        finally:
            await connection.close()
            log.info("worker stopped")

    async def _drain(self) -> None:
        if not self._inflight:
            return
        _, pending = await asyncio.wait(self._inflight, timeout=self._config.drain_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.create_task(self._process(message))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _process(self, message: AbstractIncomingMessage) -> None:
        try:
            envelope = JobMessage.model_validate_json(message.body)
        except ValidationError as exc:
            log.error(
                "unreadable job message, dead-lettering",
                extra={"fields": {"error": str(exc)[:500]}},
            )
            metrics.MESSAGES_DEAD_LETTERED.labels("unreadable").inc()
            await message.reject(requeue=False)
            return
        handler = self._handlers.get(envelope.job_type)
        if handler is None or envelope.version != ENVELOPE_VERSION:
            log.error("message for a job type or version this worker does not serve")
            metrics.MESSAGES_DEAD_LETTERED.labels("unroutable").inc()
            await message.reject(requeue=False)
            return

        carrier = _trace_carrier(envelope, message)
        with (
            tracing.span(
                f"process {envelope.job_type.value}",
                kind="consumer",
                parent=carrier,
                attributes={
                    "san.job_id": str(envelope.job_id),
                    "messaging.message.id": str(envelope.message_id),
                },
            ),
            log_context(
                job_id=envelope.job_id,
                job_type=envelope.job_type.value,
                message_id=envelope.message_id,
                trace_id=tracing.current_trace_id()
                or tracing.trace_id_of(carrier.get("traceparent")),
            ),
        ):
            try:
                await self._execute(envelope, handler)
            except asyncio.CancelledError:
                await asyncio.shield(self._requeue_on_shutdown(envelope, message))
                raise
            except _INFRA_ERRORS:
                await self._requeue_after_outage(envelope, message)
                return
            await message.ack()

    async def _execute(self, envelope: JobMessage, handler: JobHandler) -> None:
        if envelope.job_id in self._active:
            log.info("job already in progress in this worker (duplicate delivery), skipped")
            metrics.MESSAGES_SKIPPED.labels(envelope.job_type.value).inc()
            return
        self._active.add(envelope.job_id)
        try:
            await self._claim_and_settle(envelope, handler)
        finally:
            self._active.discard(envelope.job_id)

    async def _claim_and_settle(self, envelope: JobMessage, handler: JobHandler) -> None:
        async with self._sessions() as session, session.begin():
            # Not in `_active`, so a PROCESSING row owned by this worker is an attempt an
            # outage interrupted: taking it back is safe.
            job = await jobs.claim(
                session, envelope.job_id, self.worker_id, self._lease, reclaim_own=True
            )
        if job is None:
            log.info("job not claimable (done, owned by a live worker, or unknown), skipped")
            metrics.MESSAGES_SKIPPED.labels(envelope.job_type.value).inc()
            return
        metrics.JOB_QUEUE_WAIT.labels(job.job_type).observe(
            max(0.0, (datetime.now(UTC) - envelope.created_at).total_seconds())
        )
        log.info("job claimed", extra={"fields": {"attempt": job.attempt}})
        started = time.monotonic()
        heartbeat = asyncio.create_task(self._heartbeat(job.job_id))
        try:
            outcome = await self._settle(handler, job)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        metrics.JOBS_FINISHED.labels(job.job_type, outcome).inc()
        tracing.annotate(outcome=outcome, attempt=job.attempt)
        metrics.JOB_DURATION.labels(job.job_type).observe(time.monotonic() - started)

    async def _settle(self, handler: JobHandler, job: AsyncJob) -> str:
        try:
            async with self._sessions() as session, session.begin():
                payload = await handler.load(session, job)
            result = await self._run_with_retries(handler, job, payload)
            async with self._sessions() as session, session.begin():
                await handler.store(session, job, result)
                if not await jobs.complete(session, job.job_id, self.worker_id):
                    raise _LeaseLost
        except _LeaseLost:
            log.warning("lease lost to another worker; result discarded")
            return "lease_lost"
        except _INFRA_ERRORS:
            raise
        except Exception as exc:  # every other failure is the job's outcome, never a crash
            reason = f"{job.job_type} failed: {cause_chain(exc)}"
            async with self._sessions() as session, session.begin():
                if await jobs.fail(session, job.job_id, self.worker_id, reason):
                    await self._on_failure(handler, session, job, reason)
            log.warning("job failed", extra={"fields": {"error": reason}})
            return "failed"
        log.info("job completed")
        return "completed"

    async def _on_failure(
        self, handler: JobHandler, session: AsyncSession, job: AsyncJob, reason: str
    ) -> None:
        """The handler's optional `on_failure` hook, in the transaction that marks the job
        FAILED, so a domain row never stays PROCESSING behind a failed job. A savepoint
        keeps a broken hook from undoing the FAILED mark (the job must not stay claimed)."""
        hook: FailureHook | None = getattr(handler, "on_failure", None)
        if hook is None:
            return
        try:
            async with session.begin_nested():
                await hook(session, job, reason)
        except _INFRA_ERRORS:
            raise
        except Exception:
            log.exception("on_failure hook failed; the job is marked FAILED regardless")

    async def _run_with_retries(
        self, handler: JobHandler, job: AsyncJob, payload: object
    ) -> object:
        config = self._config
        tries = waits = 0
        while True:
            try:
                return await handler.run(job, payload)
            except PermanentJobError:
                raise
            except (TransientJobError, httpx.TimeoutException, httpx.TransportError) as exc:
                retry_after: float | None = getattr(exc, "retry_after", None)
                if retry_after is not None and waits < config.rate_limit_waits:
                    # Being paced is not failing: wait exactly as told, keep the try budget.
                    if retry_after > config.max_retry_after_seconds:
                        raise PermanentJobError(
                            f"asked to wait {retry_after:.0f}s, more than the "
                            f"{config.max_retry_after_seconds:.0f}s a job may wait"
                        ) from exc
                    waits += 1
                    delay = max(0.0, retry_after)
                else:
                    tries += 1
                    if tries >= config.max_tries:
                        raise PermanentJobError(f"gave up after {tries} tries") from exc
                    delay = self._backoff(tries, retry_after)
                metrics.JOB_RETRIES.labels(job.job_type).inc()
                log.info(
                    "transient failure, retrying",
                    extra={
                        "fields": {
                            "try": tries,
                            "rate_limit_waits": waits,
                            "delay_s": round(delay, 2),
                            "error": cause_chain(exc),
                        }
                    },
                )
                await asyncio.sleep(delay)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return max(0.0, retry_after)
        base = self._config.backoff_seconds * 2.0 ** (attempt - 1)
        return min(self._config.max_backoff_seconds, base) * random.uniform(0.8, 1.2)

    async def _heartbeat(self, job_id: uuid.UUID) -> None:
        interval = max(0.05, self._config.lease_seconds / 3)
        while True:
            await asyncio.sleep(interval)
            try:
                async with self._sessions() as session, session.begin():
                    if not await jobs.extend_lease(session, job_id, self.worker_id, self._lease):
                        return
            except _INFRA_ERRORS:
                log.warning("heartbeat failed; will retry")

    async def _requeue_after_outage(
        self, envelope: JobMessage, message: AbstractIncomingMessage
    ) -> None:
        count = (message.headers or {}).get("x-delivery-count", 0)
        deliveries = count if isinstance(count, int) else 0
        delay = min(self._config.max_backoff_seconds, self._config.backoff_seconds * 2**deliveries)
        log.exception(
            "infrastructure error; the message goes back after a pause",
            extra={"fields": {"deliveries": deliveries, "pause_s": round(delay, 2)}},
        )
        await asyncio.sleep(delay)
        try:
            async with self._sessions() as session, session.begin():
                await jobs.release(session, envelope.job_id, self.worker_id)
        except _INFRA_ERRORS:
            pass  # still down: the lease expires, or this worker takes the job back
        await message.nack(requeue=True)

    async def _requeue_on_shutdown(
        self, envelope: JobMessage, message: AbstractIncomingMessage
    ) -> None:
        """Give an unfinished job back: PENDING again, message back on the queue."""
        try:
            async with self._sessions() as session, session.begin():
                await jobs.release(session, envelope.job_id, self.worker_id)
            await message.nack(requeue=True)
            log.info("job released on shutdown")
        except Exception:  # the lease expiry and recovery sweep cover what this misses
            log.exception("could not release job on shutdown")


def _trace_carrier(envelope: JobMessage, message: AbstractIncomingMessage) -> dict[str, str]:
    """The trace context to continue: the relay's publish span (message headers) when the
    relay traced, else the registering request's (the envelope)."""
    headers = message.headers or {}
    if headers.get("traceparent"):
        raw = {k: headers.get(k) for k in ("traceparent", "tracestate")}
    else:
        raw = {"traceparent": envelope.traceparent, "tracestate": envelope.tracestate}
    return {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in raw.items() if v}
