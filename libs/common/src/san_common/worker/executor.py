"""The executor: one delivery → one try of a job, and the delivery settled (acked,
requeued or dead-lettered) whatever happens.

Per delivery:
1. a message of another deployment (header `x-san-deployment`) → dead letter `foreign`;
   parse the envelope — unreadable, unknown version or job type → dead letter (with the
   reason in the `x-san-reason` header);
2. claim (a new try, `tries` + 1 = its fencing token). A job this deployment does not
   know → dead letter `unknown-job` (a trace, never a silent ack: another deployment on
   the same queues with no identity on its messages). Not claimable: done → ack; held by
   another worker under a live lease → a new message is scheduled through the outbox for
   the lease's expiry, then ack (the delivery is never simply dropped); waiting for its
   next try → ack (its message for that time is already in the outbox);
3. `load` (short transaction; none for a handler with nothing to load) → `run` (no
   transaction, bounded by the job type's timeout) → `store` + COMPLETED (one transaction,
   fenced; a database outage there holds the result, below); on failure the
   `RetryPolicy` decides: a retry ends the try, sets the job PENDING with
   `next_attempt_at` and adds its next message to the outbox, due then (one transaction) —
   nobody sleeps holding a slot; giving up marks it FAILED with the cause chain;
4. ack last, so a crash anywhere before redelivers the message, and the claim makes that
   redelivery harmless.

Errors are classified by *where* they happen: an exception out of `handler.run` is the
external call's (never a database outage, even a TimeoutError / OSError); one out of the
executor's own database calls that `is_connection_loss` recognises is an outage: the try
is released (best effort), and the message requeued after a pause (`ROUND_BACKOFF` by
delivery count) — never FAILED. A claim that lost a deadlock to another transaction is
requeued the same way. Anything else is a bug: it is logged with its traceback, and its
delivery requeued after the same pause, so a bug that repeats neither spins nor passes
for an outage; the quorum queue's delivery limit ends a message that keeps failing.

Held results: an outage that interrupts the store of a result `run` produced does not give
the delivery back — the next try would ask the AI again for an answer already in hand. The
result (and the try's usage-ledger rows, if they were not written either) is held in
memory, the delivery unacked, and the store retried until the database answers
(docs/reliability.md, "Held results"). At most `held_results` at once per process and for
`hold_seconds` each; beyond either, the outage path above gives the try back. The store is
fenced like any other: a try taken over meanwhile writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Protocol

from aio_pika.exceptions import AMQPError, ChannelInvalidStateError
from pydantic import ValidationError

from san_common import metrics, usage
from san_common.deployment import DEPLOYMENT_HEADER
from san_common.errors import (
    JobFailure,
    PermanentJobError,
    Stage,
    SystemWait,
    TransientJobError,
    cause_chain,
    is_connection_loss,
    is_contention,
    summarize,
)
from san_common.jobs import registry
from san_common.jobs.envelope import ENVELOPE_VERSION, JobMessage
from san_common.jobs.lifecycle import JobState, TryOutcome
from san_common.jobs.types import JobStatus
from san_common.models import AsyncJob
from san_common.outages import DATABASE
from san_common.retry import ROUND_BACKOFF, GiveUp, Retry, RetryPolicy
from san_common.worker.handler import JobHandler, needs_load
from san_common.worker.leases import LeaseKeeper
from san_common.worker.store import Claim, JobStore

log = logging.getLogger("san_common.worker")

# Dead-letter reasons that mean another deployment shares this worker's queues.
SHARED_QUEUE_REASONS = ("foreign", "unknown-job")


class Delivery(Protocol):
    """One message as the broker handed it over (aio-pika's, or an in-memory one)."""

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, Any]: ...

    @property
    def delivery_count(self) -> int:
        """How many times the broker delivered it before (quorum queues count)."""
        ...

    async def ack(self) -> None: ...

    async def requeue(self) -> None: ...

    async def dead_letter(self, kind: str, reason: str) -> None:
        """To the dead-letter queue, keeping `kind` (header `x-san-reason`) and `reason`
        (`x-san-detail`)."""
        ...


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    RETRY = "retry"
    RATE_LIMITED = "rate_limited"
    TIMED_OUT = "timed_out"  # the job type's timeout cancelled `run`; retried like RETRY
    CANCELLED = "cancelled"  # its job was cancelled while `run` ran: nothing written
    LEASE_LOST = "lease_lost"
    SKIPPED = "skipped"
    DEFERRED = "deferred"  # another worker holds the job: the message comes back later
    REQUEUED = "requeued"  # a database outage interrupted the try
    RELEASED = "released"  # shutdown interrupted the try
    DEAD_LETTERED = "dead_lettered"


@dataclass(frozen=True)
class RuntimeConfig:
    prefetch: int = 10  # jobs running at once in the process (see consumer.py)
    lease_seconds: float = 20.0
    max_tries: int = 3
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 300.0
    drain_seconds: float = 30.0
    # Waits the remote side asked for (`retry_after`) do not spend `max_tries`, up to this
    # many per job; a wait longer than `max_retry_after_seconds` fails the job instead.
    rate_limit_waits: int = 5
    max_retry_after_seconds: float = 900.0
    # Grace added to a live lease's expiry before a deferred message comes back.
    defer_grace_seconds: float = 0.5
    # How often the consumer reads the paused job types (operators' pause/resume).
    pause_poll_seconds: float = 1.0
    outage_policy: RetryPolicy = ROUND_BACKOFF
    # Results whose store a database outage interrupted, kept in memory and stored once it
    # answers (executor docstring, "Held results"): at most this many at once (0: none
    # held, the outage gives the try back), each for at most `hold_seconds`.
    held_results: int = 100
    hold_seconds: float = 300.0

    @property
    def heartbeat_seconds(self) -> float:
        return self.lease_seconds / 3

    @property
    def amqp_heartbeat_seconds(self) -> int:
        """The AMQP heartbeat the worker asks for. A paused or cut-off worker keeps its TCP
        connection, and the broker goes on handing it messages (the rescued jobs' new ones
        among them) until heartbeats stop arriving: so that must be noticed well within a
        lease, not after RabbitMQ's default 60 s."""
        return max(2, min(10, round(self.lease_seconds / 4)))

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_tries=self.max_tries,
            backoff_seconds=self.backoff_seconds,
            max_backoff_seconds=self.max_backoff_seconds,
            max_retry_after_seconds=self.max_retry_after_seconds,
            max_rate_limit_waits=self.rate_limit_waits,
        )


@dataclass
class JobContext:
    """What middleware sees of one delivery being executed."""

    envelope: JobMessage
    delivery: Delivery
    worker_id: str
    claim: Claim | None = None
    fields: dict[str, object] = field(default_factory=dict)  # added to the outcome's log line


Next = Callable[[], Awaitable[Outcome]]
Gate = Callable[[AsyncJob], Awaitable[None]]


class TimedOut(TransientJobError):
    """`run` outlived its job type's `timeout_seconds` and was cancelled."""


Middleware = Callable[[JobContext, Next], Awaitable[Outcome]]


class _Outage(Exception):
    """The executor's own database call lost its connection, or (the claim, a deferral)
    its transaction lost a deadlock."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class Executor:
    def __init__(
        self,
        *,
        store: JobStore,
        handlers: Mapping[str, JobHandler[Any, Any]],
        config: RuntimeConfig,
        worker_id: str,
        middleware: Sequence[Middleware] = (),
        deployment_id: str | None = None,
        gate: Gate | None = None,
    ) -> None:
        # Asked before a claimed job runs (the AI worker's budget check): a `JobFailure` it
        # raises settles the try like the handler's would, before any call is made.
        self._gate = gate
        # Set by the runtime from the database before it consumes; None checks nothing.
        self.deployment_id = deployment_id
        self._warned_shared = False
        self._store = store
        self._handlers = {str(t): h for t, h in handlers.items()}
        self._config = config
        self._policy = config.retry_policy()
        self._lease = timedelta(seconds=config.lease_seconds)
        self._leases = LeaseKeeper(store, self._lease, config.heartbeat_seconds)
        self._middleware = tuple(middleware)
        self.worker_id = worker_id
        # Jobs this process is running now, each with the event set when its delivery ends.
        self._active: dict[uuid.UUID, asyncio.Event] = {}
        # The deadline of each job whose handler runs now, and the jobs cancelled meanwhile.
        self._deadlines: dict[uuid.UUID, asyncio.Timeout] = {}
        self._cancelled: set[uuid.UUID] = set()
        self._held = 0  # results held through a database outage now

    @property
    def job_types(self) -> list[str]:
        return list(self._handlers)

    async def handle(self, delivery: Delivery) -> Outcome:
        """Execute one delivery and settle it. Raises only CancelledError (shutdown), after
        giving the job and its message back."""
        sender = _text(delivery.headers.get(DEPLOYMENT_HEADER))
        if sender is not None and self.deployment_id is not None and sender != self.deployment_id:
            return await self._dead_letter(
                delivery,
                "foreign",
                f"a message of deployment {sender}; this worker serves {self.deployment_id}",
            )
        try:
            envelope = JobMessage.model_validate_json(delivery.body)
        except ValidationError as exc:
            return await self._dead_letter(
                delivery, "unreadable", f"unreadable job message: {str(exc)[:300]}"
            )
        if envelope.version != ENVELOPE_VERSION:
            return await self._dead_letter(
                delivery,
                "version",
                f"envelope version {envelope.version}; this worker reads {ENVELOPE_VERSION}",
            )
        handler = self._handlers.get(envelope.job_type)
        if handler is None:
            return await self._dead_letter(
                delivery, "unroutable", f"this worker has no handler for {envelope.job_type}"
            )
        context = JobContext(envelope, delivery, self.worker_id)
        call: Next = lambda: self._execute(context, handler)  # noqa: E731
        for middleware in reversed(self._middleware):
            call = _bind(middleware, context, call)
        return await call()

    # -- one job ---------------------------------------------------------------------------

    async def _execute(self, context: JobContext, handler: JobHandler[Any, Any]) -> Outcome:
        job_id = context.envelope.job_id
        while (running := self._active.get(job_id)) is not None:
            # Another delivery of this job runs in this process: wait until it ends, then
            # claim like any delivery (done → skipped; rescued meanwhile → a new try; held
            # elsewhere → deferred). Acking it now could drop the only message of a job
            # whose running try has just been taken over (a paused worker, resumed).
            await running.wait()
        done = asyncio.Event()
        self._active[job_id] = done
        try:
            return await self._attempt(context, handler)
        finally:
            del self._active[job_id]
            self._cancelled.discard(job_id)
            done.set()

    def running(self, job_id: uuid.UUID) -> bool:
        """A delivery of the job is being executed in this process."""
        return job_id in self._active

    def cancel_running(self, job_id: uuid.UUID) -> bool:
        """The job was cancelled while it ran (`lifecycle.cancel`, announced on
        `CANCEL_CHANNEL`): if this process runs it, its handler is stopped now, the way its
        timeout would stop it — the upstream call aborted, its connection closed. The
        cancel has already closed the try; what the handler would write is fenced out
        anyway. True when this process runs the job."""
        if job_id not in self._active:
            return False
        self._cancelled.add(job_id)
        deadline = self._deadlines.get(job_id)
        if deadline is not None:
            deadline.reschedule(asyncio.get_running_loop().time())
        return True

    async def _attempt(self, context: JobContext, handler: JobHandler[Any, Any]) -> Outcome:
        delivery = context.delivery
        try:
            try:
                # Not in `_active`, so a PROCESSING row this worker owns is a try an outage
                # interrupted: taking it back (a new try) is safe.
                got = await self._store.claim(
                    context.envelope.job_id, self.worker_id, self._lease, reclaim_own=True
                )
            except Exception as exc:
                if _is_database_state(exc):
                    raise _Outage(exc) from exc
                raise  # a bug, not an outage: logged with its traceback below
            if got is None:
                return await self._dead_letter(
                    delivery,
                    "unknown-job",
                    f"job {context.envelope.job_id} is not in this deployment's database",
                )
            if not isinstance(got, Claim):
                outcome = await self._not_claimed(context, got)
            else:
                context.claim = got
                log.debug("job claimed", extra={"fields": {"try": got.try_no}})
                outcome = await self._run_claimed(context, handler, got)
            await self._ack(delivery)
            return outcome
        except _Outage as outage:
            pause = self._pause_before_requeue(context, outage.error)
            fields = {"error": cause_chain(outage.error)[:500], "retry_in_s": pause}
            if is_connection_loss(outage.error):
                # the outage is one WARNING for the process (san_common.outages), not one
                # per delivery it interrupts
                DATABASE.lost(outage.error, "running a job")
                log.info("database unavailable; job requeued", extra={"fields": fields})
            else:
                log.warning(
                    "lost to a concurrent transaction; job requeued", extra={"fields": fields}
                )
            return await self._requeue_after(context, pause, "released after a database outage")
        except asyncio.CancelledError:
            await asyncio.shield(self._give_back(context, "released on shutdown"))
            raise
        except Exception as exc:  # a bug here must not leave the delivery unsettled
            pause = self._pause_before_requeue(context, exc)
            log.exception(
                "unexpected error executing a job; message requeued",
                extra={"fields": {"retry_in_s": pause}},
            )
            return await self._requeue_after(context, pause, "unexpected worker error")

    async def _not_claimed(self, context: JobContext, state: JobState) -> Outcome:
        if state.status not in (JobStatus.PENDING.value, JobStatus.PROCESSING.value):
            return Outcome.SKIPPED  # done: a duplicate or late delivery
        if state.status == JobStatus.PENDING.value:
            # Waiting for its next try, whose message is already in the outbox.
            context.fields["next_attempt_at"] = state.next_attempt_at
            return Outcome.SKIPPED
        # Another worker holds it under a live lease. Never drop the message: bring it back
        # when that lease runs out, so a vanished worker's job is taken over (the rescuer
        # does the same from the relay; whichever arrives second is skipped).
        expiry = state.lease_expires_at or state.now
        at = max(expiry, state.now) + timedelta(seconds=self._config.defer_grace_seconds)
        try:
            await self._store.defer(context.envelope.job_id, at)
        except Exception as exc:
            if _is_database_state(exc):
                raise _Outage(exc) from exc
            raise
        context.fields["deferred_until"] = at
        return Outcome.DEFERRED

    async def _run_claimed(
        self, context: JobContext, handler: JobHandler[Any, Any], claim: Claim
    ) -> Outcome:
        policy = self._policy_for(claim.job.job_type)
        if policy.max_tries and claim.spent >= policy.max_tries:
            # Only lost tries get a job here (a retry is scheduled only with tries left):
            # a job that keeps losing its worker (it crashes it?) ends.
            return await self._failed(
                context,
                claim,
                PermanentJobError(
                    f"gave up after {claim.spent} tries: the last one lost its worker "
                    "(lease expired)"
                ),
                Stage.WORKER,
            )
        self._leases.hold(claim)
        try:
            try:
                payload = await self._store.load(claim, handler) if needs_load(handler) else None
            except Exception as exc:
                if is_connection_loss(exc):
                    raise _Outage(exc) from exc
                return await self._failed(context, claim, exc, Stage.LOAD)
            if self._gate is not None:
                try:
                    await self._gate(claim.job)
                except JobFailure as exc:
                    return await self._failed(context, claim, exc, Stage.WORKER)
            job = claim.job
            seconds = self._timeout(job.job_type)
            with usage.collecting(job.job_id, claim.try_no, job.user_id, job.job_type) as spent:
                try:
                    # `timeout`, not `wait_for`: no task of its own per job. At the deadline
                    # the handler is cancelled where it waits: its HTTP call is aborted and
                    # its connection closed.
                    async with asyncio.timeout(seconds) as deadline:
                        self._deadlines[job.job_id] = deadline
                        if job.job_id in self._cancelled:  # cancelled while it loaded
                            deadline.reschedule(asyncio.get_running_loop().time())
                        result = await handler.run(job, payload)
                except Exception as exc:  # the external call's failure, whatever its class
                    await self._record_failed_usage(spent)
                    if job.job_id in self._cancelled:
                        # The cancel ended the job and closed this try: nothing to write.
                        return Outcome.CANCELLED
                    if isinstance(exc, TimeoutError) and deadline.expired():
                        exc = TimedOut(f"{job.job_type} timed out after {seconds:g} s")
                    return await self._failed(context, claim, exc, Stage.CALL)
                finally:
                    self._deadlines.pop(job.job_id, None)
            return await self._store_result(context, claim, handler, result, spent)
        finally:
            self._leases.release(claim)

    async def _store_result(
        self,
        context: JobContext,
        claim: Claim,
        handler: JobHandler[Any, Any],
        result: Any,
        spent: usage.TryUsage,
    ) -> Outcome:
        """The try's usage rows, then `store` + COMPLETED. A database outage in either holds
        them (`_hold`) rather than give the delivery back, so the answer `run` paid for is
        not asked for again. Only what did not get written is retried: the usage rows are
        written once (the ledger skips a try it already has, should a commit's answer have
        been lost), and a completion whose answer was lost finds its try closed and changes
        nothing."""
        unrecorded = spent if spent.calls else None
        holding: _Holding | None = None
        try:
            while True:
                began = time.monotonic()
                try:
                    if unrecorded is not None:
                        await self._record_usage(unrecorded)
                        unrecorded = None
                    stored = await self._store.finish(claim, handler, result)
                except Exception as exc:
                    if not is_connection_loss(exc):
                        if holding is not None:
                            holding.settled("failed")
                        return await self._failed(context, claim, exc, Stage.STORE)
                    try:
                        holding = holding or self._hold(claim, exc)
                        await holding.wait(exc)
                    except _Outage:  # not held (the cap), or past the hold time: given back
                        if unrecorded is not None:
                            log.warning(
                                "could not write %d AI call(s) to the usage ledger",
                                len(unrecorded.calls),
                                extra={"fields": {"error": cause_chain(exc)[:500]}},
                            )
                        raise
                    continue
                if holding is None:
                    return Outcome.COMPLETED if stored else self._lease_lost(context)
                DATABASE.answered(began)
                holding.settled("stored" if stored else "fenced")
                context.fields["held_s"] = holding.seconds
                if stored:
                    return Outcome.COMPLETED
                # Expected after an outage, not a fault: the lease ran out meanwhile and the
                # job was taken over, or cancelled, or the first store's commit made it and
                # only its answer was lost. The fence kept this store from writing.
                log.info("held result not stored: its try no longer holds the job")
                return Outcome.LEASE_LOST
        finally:
            if holding is not None:
                holding.end()

    def _hold(self, claim: Claim, error: BaseException) -> _Holding:
        """Begin holding `claim`'s result through a database outage; `_Outage` (today's
        give-back) when holding is off or `held_results` results are held already."""
        if self._held >= self._config.held_results:
            metrics.RESULTS_HELD.labels(claim.job.job_type, "over_cap").inc()
            raise _Outage(error)
        log.info(
            "database unavailable; result held until it answers",
            extra={"fields": {"try": claim.try_no, "held": self._held + 1}},
        )
        return _Holding(self, claim.job.job_type, self._config.hold_seconds)

    async def _record_usage(self, spent: usage.TryUsage) -> None:
        """The try's AI calls into the ledger. A lost connection is raised (the caller holds
        them with the result); any other failure is logged with what was lost."""
        try:
            await self._store.record_usage(spent)
        except Exception as exc:
            if is_connection_loss(exc):
                raise
            _log_failure(
                log.warning,
                f"could not write {len(spent.calls)} AI call(s) to the usage ledger",
                exc,
            )

    async def _failed(
        self, context: JobContext, claim: Claim, exc: BaseException, stage: str
    ) -> Outcome:
        job_type = claim.job.job_type
        decision = self._policy_for(job_type).decide(exc, claim.spent + 1, waits=claim.waits)
        chain = cause_chain(exc)
        try:
            if isinstance(decision, Retry):
                outcome = Outcome.RETRY if decision.spends_try else Outcome.RATE_LIMITED
                if isinstance(exc, TimedOut):
                    outcome = Outcome.TIMED_OUT
                at = await self._store.retry(
                    claim,
                    delay=decision.after,
                    error=f"{job_type} failed: {chain}",
                    summary=summarize(exc, stage, retrying=True),
                    outcome=TryOutcome(outcome.value),
                    checkpoint=getattr(exc, "checkpoint", None),
                    # a wait the system imposed (a quota, a budget) is shown as such
                    waiting_for=exc.waiting_for if isinstance(exc, SystemWait) else None,
                    waiting_key=exc.key if isinstance(exc, SystemWait) else None,
                )
                if at is None:
                    return self._lease_lost(context)
                context.fields.update(error=chain, next_attempt_at=at)
                return outcome
            assert isinstance(decision, GiveUp)
            reason = f"{decision.reason}: {chain}" if decision.reason else chain
            message = f"{job_type} failed: {reason}"
            if not await self._store.fail(claim, message, summarize(exc, stage)):
                return self._lease_lost(context)
            context.fields["error"] = reason
            return Outcome.FAILED
        except Exception as db_exc:
            if is_connection_loss(db_exc):
                raise _Outage(db_exc) from db_exc
            raise

    async def _record_failed_usage(self, spent: usage.TryUsage) -> None:
        """The AI calls of a try whose `run` failed, into the ledger: they were paid for.
        Best effort: a database outage loses these rows (logged with what was lost) rather
        than hold a try that has no result to keep."""
        if not spent.calls:
            return
        try:
            await self._store.record_usage(spent)
        except Exception as exc:
            _log_failure(
                log.warning,
                f"could not write {len(spent.calls)} AI call(s) to the usage ledger",
                exc,
            )

    def _lease_lost(self, context: JobContext) -> Outcome:
        log.warning("lease lost to another worker; this try's writes changed nothing")
        return Outcome.LEASE_LOST

    # -- giving back --------------------------------------------------------------------------

    def _pause_before_requeue(self, context: JobContext, error: BaseException) -> float:
        """Growing with the delivery count, so that neither a long outage nor a bug that
        fails every delivery spins."""
        decision = self._config.outage_policy.decide(error, context.delivery.delivery_count + 1)
        return decision.after if isinstance(decision, Retry) else 0.0

    async def _requeue_after(self, context: JobContext, pause: float, reason: str) -> Outcome:
        """Not the job's fault: pause, give the try back if the database lets us, requeue
        (also when shutdown cuts the pause short)."""
        try:
            await asyncio.sleep(pause)
        finally:
            await asyncio.shield(self._give_back(context, reason))
        return Outcome.REQUEUED

    async def _give_back(self, context: JobContext, reason: str) -> None:
        """Release the try (best effort: if the database is away, its lease runs out or this
        worker takes it back) and requeue the message. Never raises."""
        if context.claim is not None:
            try:
                await self._store.release(context.claim, reason)
            except Exception as exc:
                _log_failure(log.info, "could not release the job; its lease will expire", exc)
        try:
            await context.delivery.requeue()
        except Exception as exc:  # the channel is gone: the broker redelivers unacked messages
            _log_failure(log.info, "could not requeue the message; the broker redelivers it", exc)

    async def _ack(self, delivery: Delivery) -> None:
        try:
            await delivery.ack()
        except Exception as exc:
            # The channel closed under us (a broker reconnect): the broker redelivers the
            # message, and the claim makes the redelivery harmless.
            _log_failure(log.info, "ack failed; the broker will redeliver the message", exc)

    async def _dead_letter(self, delivery: Delivery, kind: str, reason: str) -> Outcome:
        fields = {"fields": {"reason": kind, "detail": reason}}
        if kind not in SHARED_QUEUE_REASONS:
            log.error("message dead-lettered: %s", reason, extra=fields)
        elif not self._warned_shared:
            # Once per process: a deployment sharing the queues sends a stream of these.
            self._warned_shared = True
            log.warning(
                "another deployment shares this worker's queues: its messages are"
                " dead-lettered (reason %s), and that deployment publishes its jobs"
                " again. Give each deployment an AMQP_PREFIX or a RabbitMQ vhost of its"
                " own (docs/operations.md, 'Separating deployments on one broker')."
                " Further such messages are counted in san_messages_dead_lettered_total,"
                " not logged.",
                kind,
                extra=fields,
            )
        else:
            log.debug("message dead-lettered: %s", reason, extra=fields)
        metrics.MESSAGES_DEAD_LETTERED.labels(kind).inc()
        try:
            await delivery.dead_letter(kind, reason)
        except Exception:
            log.exception("could not dead-letter the message; requeued")
            with contextlib.suppress(Exception):
                await delivery.requeue()
        return Outcome.DEAD_LETTERED

    def _policy_for(self, job_type: str) -> RetryPolicy:
        spec = registry.find(job_type)
        return spec.retry if spec is not None and spec.retry is not None else self._policy

    def _timeout(self, job_type: str) -> float:
        spec = registry.find(job_type)
        return spec.timeout_seconds if spec is not None else 600.0


# The first wait of a held result before its store goes again, doubled each time up to the
# last: short, so a held result lands within a couple of seconds of the database's return.
HOLD_FIRST_WAIT_SECONDS = 0.25
HOLD_LAST_WAIT_SECONDS = 2.0


class _Holding:
    """One result held through a database outage: counted against the process's cap (and
    in the `san_worker_held_results` gauge) until `end`."""

    def __init__(self, executor: Executor, job_type: str, hold_seconds: float) -> None:
        self._executor = executor
        self._job_type = job_type
        self._began = time.monotonic()
        self._until = self._began + hold_seconds
        self._wait = HOLD_FIRST_WAIT_SECONDS
        self._ended = False
        executor._held += 1
        metrics.HELD_RESULTS.inc()

    @property
    def seconds(self) -> float:
        return round(time.monotonic() - self._began, 1)

    async def wait(self, error: BaseException) -> None:
        """Until the store is worth trying again; `_Outage` once the hold time is spent."""
        if time.monotonic() + self._wait > self._until:
            self.settled("given_back")
            raise _Outage(error)
        # the outage's one WARNING (san_common.outages), not one per result held
        DATABASE.lost(error, "storing a job's result")
        await asyncio.sleep(self._wait)
        self._wait = min(self._wait * 2, HOLD_LAST_WAIT_SECONDS)

    def settled(self, how: str) -> None:
        metrics.RESULTS_HELD.labels(self._job_type, how).inc()

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._executor._held -= 1
            metrics.HELD_RESULTS.dec()


def _is_database_state(exc: BaseException) -> bool:
    """Raised by one of the executor's own database calls because of the database's state
    (the connection gone, or the transaction lost a deadlock), not because of a bug."""
    return is_connection_loss(exc) or is_contention(exc)


def _log_failure(emit: Callable[..., None], message: str, exc: BaseException) -> None:
    """An expected failure (the database or the broker connection gone) is one line with
    its cause chain; anything else keeps its traceback."""
    if is_connection_loss(exc) or _is_amqp_loss(exc):
        emit(message, extra={"fields": {"error": cause_chain(exc)[:500]}})
    else:
        emit(message, exc_info=exc)


def _is_amqp_loss(exc: BaseException) -> bool:
    """The broker connection or channel went away under an ack / requeue."""
    return isinstance(exc, AMQPError | ChannelInvalidStateError | ConnectionError)


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bind(middleware: Middleware, context: JobContext, call: Next) -> Next:
    return lambda: middleware(context, call)
