"""The executor against an in-memory store and delivery: what it decides, and that every
delivery is settled exactly once."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import asyncpg
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from san_common.deployment import DEPLOYMENT_HEADER
from san_common.errors import PermanentJobError, TransientJobError
from san_common.models import AsyncJob
from san_common.retry import RetryPolicy
from san_common.worker import Executor, JobHandler, Outcome, RuntimeConfig, Write
from san_common.worker.handler import needs_load, writes_one_statement
from tests.unit.memory import Broken, MemoryDelivery, MemoryStore, delivery_for, new_job

CONFIG = RuntimeConfig(
    max_tries=3,
    backoff_seconds=2.0,
    outage_policy=RetryPolicy(max_tries=0, backoff_seconds=0.0, retry_everything=True),
)


class Scripted:
    """A handler whose `run` raises the scripted errors in turn, then returns "result"."""

    job_type: ClassVar[str] = "CARD_ANALYSIS"

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.runs = 0
        self.seen_checkpoint: object = None

    async def load(self, session: Any, job: AsyncJob) -> str:
        return "payload"

    async def run(self, job: AsyncJob, payload: str) -> str:
        self.runs += 1
        self.seen_checkpoint = job.checkpoint
        if self.errors:
            raise self.errors.pop(0)
        return "result"

    async def store(self, session: Any, job: AsyncJob, result: str) -> None:
        assert result == "result"


def executor(store: MemoryStore, handler: Scripted) -> Executor:
    return Executor(
        store=store, handlers={"CARD_ANALYSIS": handler}, config=CONFIG, worker_id="w-test"
    )


async def test_a_job_completes_and_its_delivery_is_acked() -> None:
    store, handler = MemoryStore(), Scripted()
    job = store.add(new_job())
    delivery = delivery_for(job)
    assert await executor(store, handler).handle(delivery) == Outcome.COMPLETED
    assert delivery.settled == ["ack"]
    assert (job.status, job.tries, store.stored) == ("COMPLETED", 1, ["result"])


async def test_a_transient_failure_schedules_the_next_try_and_acks_without_waiting() -> None:
    store, handler = MemoryStore(), Scripted(TransientJobError("AI server answered 503"))
    job = store.add(new_job())
    delivery = delivery_for(job)
    assert await executor(store, handler).handle(delivery) == Outcome.RETRY
    assert delivery.settled == ["ack"]
    (retry,) = store.retries
    assert retry["delay"] == 2.0 and retry["outcome"] == "retry"
    assert retry["error"] == "CARD_ANALYSIS failed: AI server answered 503"
    assert retry["summary"].endswith("; will retry")
    assert job.status == "PENDING" and job.next_attempt_at is not None


@pytest.mark.parametrize("error", [TimeoutError(), ConnectionResetError("reset"), OSError("x")])
async def test_an_os_error_from_the_handler_is_the_call_s_failure_never_an_outage(
    error: BaseException,
) -> None:
    store, handler = MemoryStore(), Scripted(error)
    job = store.add(new_job())
    delivery = delivery_for(job)
    outcome = await executor(store, handler).handle(delivery)
    # TimeoutError / ConnectionError are transient; a bare OSError is not known to be
    assert outcome in (Outcome.RETRY, Outcome.FAILED)
    assert outcome != Outcome.REQUEUED and delivery.settled == ["ack"]


async def test_the_last_try_fails_the_job_with_the_cause_chain() -> None:
    store, handler = MemoryStore(spent=2), Scripted(TransientJobError("AI timed out"))
    job = store.add(new_job())
    assert await executor(store, handler).handle(delivery_for(job)) == Outcome.FAILED
    assert job.error_message == "CARD_ANALYSIS failed: gave up after 3 tries: AI timed out"
    assert job.error_summary == "temporary failure during the external call"


async def test_a_permanent_failure_fails_at_once() -> None:
    store, handler = MemoryStore(), Scripted(PermanentJobError("scrap is gone"))
    job = store.add(new_job())
    assert await executor(store, handler).handle(delivery_for(job)) == Outcome.FAILED
    assert job.error_message == "CARD_ANALYSIS failed: scrap is gone"


async def test_a_rate_limit_wait_spends_no_try_and_keeps_the_checkpoint() -> None:
    limited = TransientJobError("slow down", retry_after=30.0)
    limited.checkpoint = {"analysis": {"title": "kept"}}
    store, handler = MemoryStore(), Scripted(limited)
    job = store.add(new_job())
    assert await executor(store, handler).handle(delivery_for(job)) == Outcome.RATE_LIMITED
    (retry,) = store.retries
    assert retry["delay"] == 30.0 and retry["outcome"] == "rate_limited"
    assert retry["checkpoint"] == {"analysis": {"title": "kept"}}


@pytest.mark.parametrize("stage", ["claim", "load", "finish", "fail"])
@pytest.mark.parametrize(
    "loss",
    [
        lambda: asyncpg.exceptions.AdminShutdownError("terminating connection"),
        lambda: sa_exc.DBAPIError("S", {}, Exception("database system is shutting down")),
        lambda: sa_exc.DBAPIError("S", {}, Exception("x"), connection_invalidated=True),
        lambda: ConnectionResetError("reset"),
    ],
)
async def test_a_lost_database_connection_requeues_never_fails(stage: str, loss: Any) -> None:
    errors = [PermanentJobError("the job's own failure")] if stage == "fail" else []
    store, handler = MemoryStore(fail_on={stage: loss()}), Scripted(*errors)
    job = store.add(new_job())
    delivery = delivery_for(job)
    # With no result held (WORKER_HELD_RESULTS=0) a lost store gives the try back as well.
    runner = Executor(
        store=store,
        handlers={"CARD_ANALYSIS": handler},
        config=dataclasses.replace(CONFIG, held_results=0),
        worker_id="w-test",
    )
    assert await runner.handle(delivery) == Outcome.REQUEUED
    assert delivery.settled == ["requeue"]
    assert job.status == "PENDING"  # released (the claim's own failure never claimed it)
    assert job.error_message is None


async def test_a_lost_connection_in_the_store_holds_the_result_and_stores_it_once() -> None:
    """The real outage is tests/faults/test_store_outage.py; this is the decision."""
    loss = asyncpg.exceptions.AdminShutdownError("terminating connection")
    store, handler = MemoryStore(fail_on={"finish": loss}), Scripted()
    job = store.add(new_job())
    delivery = delivery_for(job)
    assert await executor(store, handler).handle(delivery) == Outcome.COMPLETED
    assert handler.runs == 1 and store.stored == ["result"]
    assert delivery.settled == ["ack"] and job.status == "COMPLETED"


async def test_a_result_held_past_the_hold_time_is_given_back() -> None:
    loss = asyncpg.exceptions.AdminShutdownError("terminating connection")
    store, handler = MemoryStore(fail_on={"finish": loss}), Scripted()
    job = store.add(new_job())
    delivery = delivery_for(job)
    runner = Executor(
        store=store,
        handlers={"CARD_ANALYSIS": handler},
        config=dataclasses.replace(CONFIG, hold_seconds=0.1),
        worker_id="w-test",
    )
    assert await runner.handle(delivery) == Outcome.REQUEUED
    assert delivery.settled == ["requeue"] and store.stored == []


async def test_an_unexpected_store_error_still_settles_the_delivery() -> None:
    store, handler = MemoryStore(fail_on={"fail": Broken("a bug")}), Scripted(ValueError("x"))
    job = store.add(new_job())
    delivery = delivery_for(job)
    assert await executor(store, handler).handle(delivery) == Outcome.REQUEUED
    assert delivery.settled == ["requeue"] and job.status == "PENDING"


async def test_a_bug_in_the_claim_is_logged_as_a_bug_not_as_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fresh worker whose claim raised AttributeError once passed for a database outage:
    a warning without a traceback, and a retry that hid the bug."""
    caplog.set_level(logging.INFO, logger="san_common.worker")
    bug = AttributeError("'AsyncJob' object has no attribute 'tries'")
    store, handler = MemoryStore(fail_on={"claim": bug}), Scripted()
    job = store.add(new_job())
    delivery = delivery_for(job)
    assert await executor(store, handler).handle(delivery) == Outcome.REQUEUED
    assert delivery.settled == ["requeue"] and handler.runs == 0 and job.status == "PENDING"
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.levelno == logging.ERROR and line.getMessage().startswith("unexpected error")
    assert line.exc_info is not None and isinstance(line.exc_info[1], AttributeError)


async def test_a_claim_that_loses_a_deadlock_is_requeued_as_contention(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="san_common.worker")
    deadlock = asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
    store, handler = MemoryStore(fail_on={"claim": deadlock}), Scripted()
    job = store.add(new_job())
    delivery = delivery_for(job)
    assert await executor(store, handler).handle(delivery) == Outcome.REQUEUED
    assert delivery.settled == ["requeue"] and handler.runs == 0
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert line.getMessage() == "lost to a concurrent transaction; job requeued"


def _pausing(seconds: float) -> RuntimeConfig:
    return RuntimeConfig(
        outage_policy=RetryPolicy(max_tries=0, backoff_seconds=seconds, retry_everything=True)
    )


async def test_a_bug_that_repeats_does_not_spin_its_delivery() -> None:
    """The requeued delivery comes straight back; without the outage's pause, a bug that
    fails every claim would loop at full speed until the delivery limit."""
    store, handler = MemoryStore(fail_on={"claim": Broken("a bug")}), Scripted()
    job = store.add(new_job())
    run = Executor(
        store=store, handlers={"CARD_ANALYSIS": handler}, config=_pausing(0.3), worker_id="w"
    )
    started = asyncio.get_running_loop().time()
    assert await run.handle(delivery_for(job)) == Outcome.REQUEUED
    assert asyncio.get_running_loop().time() - started >= 0.3


async def test_shutdown_during_the_pause_still_gives_the_try_and_the_message_back() -> None:
    store, handler = MemoryStore(fail_on={"fail": Broken("a bug")}), Scripted(ValueError("x"))
    job = store.add(new_job())
    delivery = delivery_for(job)
    run = Executor(
        store=store, handlers={"CARD_ANALYSIS": handler}, config=_pausing(60.0), worker_id="w"
    )
    task = asyncio.create_task(run.handle(delivery))
    async with asyncio.timeout(5):  # until the try ran and its `fail` raised: the pause
        while "fail" in store.fail_on:
            await asyncio.sleep(0.01)
    assert job.status == "PROCESSING" and delivery.settled == []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert delivery.settled == ["requeue"] and job.status == "PENDING"


async def test_a_fenced_out_finish_is_lease_lost() -> None:
    store, handler = MemoryStore(finish_result=False), Scripted()
    job = store.add(new_job())
    delivery = delivery_for(job)
    assert await executor(store, handler).handle(delivery) == Outcome.LEASE_LOST
    assert delivery.settled == ["ack"] and store.stored == []


async def test_a_duplicate_after_completion_is_skipped_and_not_run_again() -> None:
    store, handler = MemoryStore(), Scripted()
    job = store.add(new_job())
    run = executor(store, handler)
    assert await run.handle(delivery_for(job)) == Outcome.COMPLETED
    late = delivery_for(job)
    assert await run.handle(late) == Outcome.SKIPPED
    assert late.settled == ["ack"] and handler.runs == 1 and job.tries == 1


async def test_a_job_under_another_worker_s_live_lease_is_deferred_to_its_expiry() -> None:
    store, handler = MemoryStore(), Scripted()
    expiry = datetime.now(UTC) + timedelta(seconds=15)
    job = store.add(new_job())
    job.status, job.worker_id, job.lease_expires_at = "PROCESSING", "other", expiry
    delivery = delivery_for(job)
    assert await executor(store, handler).handle(delivery) == Outcome.DEFERRED
    assert delivery.settled == ["ack"] and handler.runs == 0
    assert store.deferred == [expiry + timedelta(seconds=CONFIG.defer_grace_seconds)]


async def test_an_expired_lease_is_taken_over_under_the_same_job_id() -> None:
    store, handler = MemoryStore(), Scripted()
    job = store.add(new_job())
    job.status, job.worker_id, job.tries = "PROCESSING", "dead", 1
    job.lease_expires_at = datetime.now(UTC) - timedelta(seconds=1)
    assert await executor(store, handler).handle(delivery_for(job)) == Outcome.COMPLETED
    assert (job.status, job.tries) == ("COMPLETED", 2)


async def test_a_job_waiting_for_its_next_try_is_not_run_early() -> None:
    store, handler = MemoryStore(), Scripted()
    job = store.add(new_job())
    job.next_attempt_at = datetime.now(UTC) + timedelta(minutes=5)
    assert await executor(store, handler).handle(delivery_for(job)) == Outcome.SKIPPED
    assert handler.runs == 0 and job.status == "PENDING"


async def test_a_job_that_keeps_losing_its_worker_ends_failed() -> None:
    store, handler = MemoryStore(spent=3), Scripted()
    job = store.add(new_job())
    assert await executor(store, handler).handle(delivery_for(job)) == Outcome.FAILED
    assert handler.runs == 0 and "lost its worker" in (job.error_message or "")


@pytest.mark.parametrize(
    ("delivery", "reason"),
    [
        (MemoryDelivery(b"{not json"), "unreadable job message"),
        (None, "envelope version 2; this worker reads 1"),
        (None, "this worker has no handler for SCRAP_REFINE"),
    ],
)
async def test_messages_it_cannot_run_are_dead_lettered_with_their_reason(
    delivery: MemoryDelivery | None, reason: str
) -> None:
    store, handler = MemoryStore(), Scripted()
    job = store.add(new_job())
    if delivery is None:
        change = {"version": 2} if "version" in reason else {"job_type": "SCRAP_REFINE"}
        delivery = delivery_for(job, **change)
    assert await executor(store, handler).handle(delivery) == Outcome.DEAD_LETTERED
    assert delivery.settled == ["dead_letter"] and handler.runs == 0
    assert delivery.dead_reason is not None and delivery.dead_reason.startswith(reason)


async def test_messages_of_another_deployment_or_an_unknown_job_are_dead_lettered_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, handler = MemoryStore(), Scripted()
    run = executor(store, handler)
    run.deployment_id = "ours"
    foreign = [delivery_for(store.add(new_job())) for _ in range(3)]
    for delivery in foreign:
        delivery.headers = {DEPLOYMENT_HEADER: b"theirs"}
    unknown = [delivery_for(new_job()) for _ in range(2)]  # jobs the store never saw
    with caplog.at_level(logging.DEBUG, logger="san_common.worker"):
        for delivery in [*foreign, *unknown]:
            assert await run.handle(delivery) == Outcome.DEAD_LETTERED
    assert [d.dead_kind for d in foreign] == ["foreign"] * 3
    assert [d.dead_kind for d in unknown] == ["unknown-job"] * 2
    assert all(d.settled == ["dead_letter"] for d in [*foreign, *unknown])
    assert handler.runs == 0 and all(j.tries == 0 for j in store.jobs.values())
    assert foreign[0].dead_reason == "a message of deployment theirs; this worker serves ours"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "AMQP_PREFIX" in warnings[0].getMessage() and "vhost" in warnings[0].getMessage()


async def test_a_message_of_this_deployment_or_without_an_identity_runs() -> None:
    store, handler = MemoryStore(), Scripted()
    run = executor(store, handler)
    run.deployment_id = "ours"
    ours = delivery_for(store.add(new_job()))
    ours.headers = {DEPLOYMENT_HEADER: "ours"}
    older = delivery_for(store.add(new_job()))  # published before messages carried it
    assert await run.handle(ours) == Outcome.COMPLETED
    assert await run.handle(older) == Outcome.COMPLETED
    assert ours.settled == older.settled == ["ack"]


async def test_shutdown_mid_job_releases_it_and_requeues_the_message() -> None:
    store = MemoryStore()
    started = asyncio.Event()

    class Hangs(Scripted):
        async def run(self, job: AsyncJob, payload: str) -> str:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("never")

    job = store.add(new_job())
    delivery = delivery_for(job)
    task = asyncio.create_task(executor(store, Hangs()).handle(delivery))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert delivery.settled == ["requeue"] and job.status == "PENDING"
    assert store.tries == [(job.job_id, 1, "released")]


class _RowOnly(JobHandler[None, str]):
    """A job whose row is all it needs: no `load` of its own."""

    job_type: ClassVar[str] = "CARD_ANALYSIS"

    def __init__(self) -> None:
        self.payloads: list[object] = []

    async def run(self, job: AsyncJob, payload: None) -> str:
        self.payloads.append(payload)
        return "result"

    async def store(self, session: Any, job: AsyncJob, result: str) -> None:
        assert result == "result"


async def test_a_handler_with_nothing_to_load_gets_no_load_call() -> None:
    # Were `load` called, this store's load would raise and the job would fail.
    store, handler = MemoryStore(fail_on={"load": Broken("no load expected")}), _RowOnly()
    job = store.add(new_job())
    outcome = await Executor(
        store=store, handlers={"CARD_ANALYSIS": handler}, config=CONFIG, worker_id="w-test"
    ).handle(delivery_for(job))
    assert outcome == Outcome.COMPLETED and handler.payloads == [None]
    assert (job.status, store.stored) == ("COMPLETED", ["result"])


def test_a_handler_needs_a_load_when_its_class_defines_one() -> None:
    class Loads(_RowOnly):
        async def load(self, session: Any, job: AsyncJob) -> None:
            return None

    assert not needs_load(_RowOnly())
    assert needs_load(Loads()) and needs_load(Scripted())  # subclassed or duck-typed


def test_a_handler_writes_one_statement_when_it_keeps_the_base_store() -> None:
    class Writes(JobHandler[None, str]):
        job_type: ClassVar[str] = "CARD_ANALYSIS"

        async def run(self, job: AsyncJob, payload: None) -> str:
            return "result"

        def write(self, job: AsyncJob, result: str) -> Write:
            return Write(text("SELECT 1"), {})

    assert writes_one_statement(Writes())
    assert not writes_one_statement(_RowOnly()) and not writes_one_statement(Scripted())


async def test_a_handler_with_neither_store_nor_write_says_so() -> None:
    class Neither(JobHandler[None, str]):
        job_type: ClassVar[str] = "CARD_ANALYSIS"

        async def run(self, job: AsyncJob, payload: None) -> str:
            return "result"

    with pytest.raises(TypeError, match="Neither has neither store nor write"):
        await Neither().store(None, new_job(), "result")  # type: ignore[arg-type]
