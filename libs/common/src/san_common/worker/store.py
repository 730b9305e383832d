"""The executor's port to the database: each method is one short transaction.

`SqlJobStore` is the real one; the unit tier gives the executor an in-memory store with
the same methods. Every write of a try is fenced (`jobs.lifecycle`): the methods that
settle a try return False (or None) when the try no longer holds the job.
"""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler

from san_common.db.engine import bound_engine, driver_connection
from san_common.errors import is_connection_loss, is_contention
from san_common.jobs import lifecycle as jobs
from san_common.jobs.lifecycle import JobState, TryOutcome
from san_common.models import AsyncJob
from san_common.usage import TryUsage, ledger
from san_common.worker.batching import Batcher
from san_common.worker.handler import JobHandler, writes_one_statement


@dataclass(frozen=True)
class Claim:
    """The try a worker holds: the job as claimed, the try's number (its fencing token),
    and how many earlier tries spent the retry budget or were rate-limit waits."""

    job: AsyncJob
    try_no: int
    spent: int = 0
    waits: int = 0


class JobStore(Protocol):
    async def claim(
        self, job_id: uuid.UUID, worker_id: str, lease: timedelta, *, reclaim_own: bool
    ) -> Claim | JobState | None:
        """The claim, else the job's state (why not), else None (unknown job)."""
        ...

    async def load(self, claim: Claim, handler: JobHandler[Any, Any]) -> Any: ...

    async def finish(self, claim: Claim, handler: JobHandler[Any, Any], result: Any) -> bool:
        """`handler.store` and COMPLETED in one transaction; False (rolled back) when the
        try no longer holds the job."""
        ...

    async def fail(self, claim: Claim, message: str, summary: str) -> bool: ...

    async def retry(
        self,
        claim: Claim,
        *,
        delay: float,
        error: str,
        summary: str,
        outcome: TryOutcome,
        checkpoint: dict[str, object] | None,
        waiting_for: str | None = None,
        waiting_key: str | None = None,
    ) -> datetime | None: ...

    async def release(self, claim: Claim, reason: str) -> bool: ...

    async def extend(self, claim: Claim, lease: timedelta) -> bool: ...

    async def defer(self, job_id: uuid.UUID, at: datetime) -> bool: ...

    async def record_usage(self, spent: TryUsage) -> None:
        """A try's AI calls into the usage ledger (not fenced: they were paid for)."""
        ...


# How often a completion that lost a deadlock to another transaction is run again before
# its error counts against the job (each try of it waits PostgreSQL's deadlock_timeout).
CONTENTION_ATTEMPTS = 3


class _LeaseLost(Exception):
    """Raised inside `finish` to roll the handler's writes back; `held` are the jobs of a
    batch whose tries still held them."""

    def __init__(self, held: set[uuid.UUID] | None = None) -> None:
        super().__init__("lease lost")
        self.held = held or set()


class _StoreFailed(Exception):
    """The `store` of a batch's item `index` raised (its exception is the cause); None: a
    write the batch shared among several jobs raised, nobody knows whose."""

    def __init__(self, index: int | None) -> None:
        super().__init__(f"store of batch item {index} failed")
        self.index = index


@dataclass(frozen=True)
class _ClaimAsk:
    job_id: uuid.UUID
    worker_id: str
    lease: timedelta
    reclaim_own: bool


@dataclass(frozen=True)
class _Finish:
    claim: Claim
    handler: JobHandler[Any, Any]
    result: Any

    @property
    def job_id(self) -> uuid.UUID:
        return self.claim.job.job_id


@dataclass(frozen=True)
class _DriverSql:
    """A handler's write statement as the driver runs it: its SQL, and the order of its
    parameters."""

    sql: str
    names: tuple[str, ...]
    compiled: Any  # the SQLAlchemy `Compiled`, to fill in the statement's own parameters

    def arguments(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        values = self.compiled.construct_params(params)
        return tuple(values[name] for name in self.names)


# Each write statement compiled once (the statements are module constants).
_ON_DRIVER: weakref.WeakKeyDictionary[ClauseElement, _DriverSql | None] = (
    weakref.WeakKeyDictionary()
)


def _on_driver(statement: Executable, dialect: Dialect) -> _DriverSql | None:
    """`statement` compiled for the driver, when running it there changes nothing: no
    parameter that SQLAlchemy converts on the way (a JSON column's), none that it computes
    at execution (a Python-side default). Else None: it goes through SQLAlchemy."""
    if not isinstance(statement, ClauseElement):
        return None
    if statement in _ON_DRIVER:
        return _ON_DRIVER[statement]
    compiled = statement.compile(dialect=dialect)
    found = None
    if (
        isinstance(compiled, SQLCompiler)
        and compiled.positiontup is not None
        and not compiled.insert_prefetch
        and not compiled.update_prefetch
        and all(
            bind.type.dialect_impl(dialect).bind_processor(dialect) is None
            for bind in compiled.binds.values()
        )
    ):
        found = _DriverSql(compiled.string, tuple(compiled.positiontup), compiled)
    _ON_DRIVER[statement] = found
    return found


def _check_held(done: set[uuid.UUID], count: int) -> None:
    """Fencing of a completion: unless each of the `count` tries still held its job,
    `_LeaseLost` rolls the whole transaction back (the writes of a try taken over never
    commit)."""
    if len(done) < count:
        raise _LeaseLost(done)


async def _outcome(finishing: Awaitable[bool]) -> bool | BaseException:
    try:
        return await finishing
    except Exception as exc:
        return exc


def _grouped(asks: Sequence[_ClaimAsk]) -> dict[tuple[str, timedelta, bool], list[uuid.UUID]]:
    groups: dict[tuple[str, timedelta, bool], list[uuid.UUID]] = {}
    for ask in asks:
        groups.setdefault((ask.worker_id, ask.lease, ask.reclaim_own), []).append(ask.job_id)
    return groups


class SqlJobStore:
    """The runtime's transactions; each is an event of `jobs.lifecycle`, which also moves
    the mirrored status of the job's target row (registry `Mirror`), so no handler writes it.

    Claims and completions are group-committed (`Batcher`): the jobs of this process that
    ask at about the same time share one transaction and one statement. A completion batch
    that cannot commit as a whole — one handler's `store` raised, or one try was taken over
    — is redone one job per transaction, so each job gets exactly its own outcome."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], *, max_batch: int = 100) -> None:
        self._sessions = sessions
        self._engine = bound_engine(sessions)
        self._claims: Batcher[_ClaimAsk, Claim | JobState | None] = Batcher(
            self._claim_batch, max_size=max_batch, abandoned=self._release_abandoned
        )
        self._finishes: Batcher[_Finish, bool] = Batcher(self._finish_batch, max_size=max_batch)
        self._usage: Batcher[TryUsage, None] = Batcher(self._usage_batch, max_size=max_batch)
        self._extends: Batcher[tuple[Claim, timedelta], bool] = Batcher(
            self._extend_batch, max_size=max_batch
        )

    async def claim(
        self, job_id: uuid.UUID, worker_id: str, lease: timedelta, *, reclaim_own: bool
    ) -> Claim | JobState | None:
        return await self._claims.submit(_ClaimAsk(job_id, worker_id, lease, reclaim_own))

    async def _claim_batch(self, asks: Sequence[_ClaimAsk]) -> list[Claim | JobState | None]:
        found: dict[uuid.UUID, Claim | JobState | None] = {}
        # One statement is the whole claim (mirrors included): no transaction around it,
        # and run on the driver.
        async with driver_connection(self._engine) as connection:
            # One statement per kind of ask (in practice one: a worker asks alike).
            for (worker_id, lease, reclaim_own), ids in _grouped(asks).items():
                got = await jobs.claim_batch(
                    connection, ids, worker_id, lease, reclaim_own=reclaim_own
                )
                for job_id, result in got.items():
                    if isinstance(result, jobs.Claimed):
                        job = result.job
                        found[job_id] = Claim(job, job.tries, result.spent, result.waits)
                    else:
                        found[job_id] = result
        return [found[ask.job_id] for ask in asks]

    async def _release_abandoned(self, ask: _ClaimAsk, got: Claim | JobState | None) -> None:
        # Its caller was cancelled (shutdown) while the batch claimed it: nobody runs it.
        if isinstance(got, Claim):
            with contextlib.suppress(Exception):  # else its lease runs out: the rescuer
                await self.release(got, "released on shutdown")

    async def load(self, claim: Claim, handler: JobHandler[Any, Any]) -> Any:
        async with self._sessions() as session, session.begin():
            return await handler.load(session, claim.job)

    async def finish(self, claim: Claim, handler: JobHandler[Any, Any], result: Any) -> bool:
        return await self._finishes.submit(_Finish(claim, handler, result))

    async def _finish_batch(self, batch: Sequence[_Finish]) -> list[bool | BaseException]:
        """Each item's outcome: True (stored and COMPLETED), False (its try was taken over;
        nothing of it committed), or the exception its own `store` raised."""
        if len(batch) == 1:
            return [await _outcome(self._finish_one(batch[0]))]
        try:
            await self._finish_together(batch)
            return [True] * len(batch)
        except _LeaseLost as lost:
            # Those tries were taken over: False, and their stores are not run again. The
            # rest rolled back with them, so they go again.
            again = iter(await self._finish_batch([i for i in batch if i.job_id in lost.held]))
            return [next(again) if i.job_id in lost.held else False for i in batch]
        except _StoreFailed as failed:
            if failed.index is None:
                # A shared write raised: each job again on its own finds whose it was.
                return [await _outcome(self._finish_one(item)) for item in batch]
            # One handler's store raised: that job alone gets its outcome (its store again,
            # on its own: the error may have been the batch's, such as two jobs' rows
            # colliding); the rest go again.
            rest = [i for k, i in enumerate(batch) if k != failed.index]
            alone = await _outcome(self._finish_one(batch[failed.index]))
            again = iter(await self._finish_batch(rest))
            return [alone if k == failed.index else next(again) for k in range(len(batch))]
        except Exception as exc:
            if not is_contention(exc):
                raise
            # The batch lost a deadlock to another transaction (another worker's, locking
            # some of the same rows in another order): nothing of it committed. Each job
            # again in a transaction of its own, which holds fewer locks at once.
            return [await _outcome(self._finish_one(item)) for item in batch]

    async def _finish_together(self, batch: Sequence[_Finish]) -> None:
        written = self._written(batch)
        if written is not None:
            await self._finish_on_driver(batch, written)
            return
        async with self._sessions() as session, session.begin():
            shared: dict[Executable, list[Mapping[str, Any]]] = {}
            for index, item in enumerate(batch):
                try:
                    if writes_one_statement(item.handler):
                        write = item.handler.write(item.claim.job, item.result)
                        shared.setdefault(write.statement, []).append(write.params)
                    else:
                        await item.handler.store(session, item.claim.job, item.result)
                except Exception as exc:
                    if is_connection_loss(exc):
                        raise  # the outage is every job's: each requeues
                    raise _StoreFailed(index) from exc
            connection = await session.connection()
            for statement, params in shared.items():
                try:
                    await connection.execute(statement, params)
                except Exception as exc:
                    if is_connection_loss(exc):
                        raise
                    raise _StoreFailed(None) from exc
            done = await jobs.complete_batch(
                session, [(item.job_id, item.claim.try_no) for item in batch]
            )
            _check_held(done, len(batch))

    def _written(self, batch: Sequence[_Finish]) -> dict[str, list[tuple[Any, ...]]] | None:
        """The batch's writes grouped by statement, for the driver: when every handler's
        results are one statement that the driver can run as it is (`_on_driver`); else
        None. A handler's `write` that raises is its store failing."""
        if not all(writes_one_statement(item.handler) for item in batch):
            return None
        shared: dict[str, list[tuple[Any, ...]]] = {}
        for index, item in enumerate(batch):
            try:
                write = item.handler.write(item.claim.job, item.result)
                on_driver = _on_driver(write.statement, self._engine.dialect)
                if on_driver is None:
                    return None
                shared.setdefault(on_driver.sql, []).append(on_driver.arguments(write.params))
            except Exception as exc:
                raise _StoreFailed(index) from exc
        return shared

    async def _finish_on_driver(
        self,
        batch: Sequence[_Finish],
        written: Mapping[str, Sequence[tuple[Any, ...]]],
        *,
        shared: bool = True,
    ) -> None:
        """The writes and the completion of `batch` on the driver, in one transaction,
        without SQLAlchemy's session around them (which cost a one-job batch about a third
        of its CPU: docs/hot-paths.md). A write that fails is `_StoreFailed` when the
        batch `shared` it, else its own error."""
        async with driver_connection(self._engine) as connection, connection.transaction():
            for sql, arguments in written.items():
                try:
                    await connection.executemany(sql, arguments)
                except Exception as exc:
                    if is_connection_loss(exc) or not shared:
                        raise
                    raise _StoreFailed(None) from exc
            done = await jobs.complete_batch(
                connection, [(item.job_id, item.claim.try_no) for item in batch]
            )
            _check_held(done, len(batch))

    async def _finish_one(self, item: _Finish) -> bool:
        claim = item.claim
        on_driver: _DriverSql | None = None
        if writes_one_statement(item.handler):
            write = item.handler.write(claim.job, item.result)
            on_driver = _on_driver(write.statement, self._engine.dialect)
        attempt = 1
        while True:
            try:
                if on_driver is not None:
                    written = {on_driver.sql: [on_driver.arguments(write.params)]}
                    await self._finish_on_driver([item], written, shared=False)
                    return True
                async with self._sessions() as session, session.begin():
                    await item.handler.store(session, claim.job, item.result)
                    if not await jobs.complete(session, claim.job.job_id, claim.try_no):
                        raise _LeaseLost
                return True
            except _LeaseLost:
                return False
            except Exception as exc:
                # A lost deadlock is the other transaction's timing, not this job's fault:
                # it rolled back whole, so the store runs again instead of spending a try.
                if attempt == CONTENTION_ATTEMPTS or not is_contention(exc):
                    raise
                attempt += 1

    async def fail(self, claim: Claim, message: str, summary: str) -> bool:
        async with self._sessions() as session, session.begin():
            return await jobs.fail(session, claim.job.job_id, claim.try_no, message, summary)

    async def retry(
        self,
        claim: Claim,
        *,
        delay: float,
        error: str,
        summary: str,
        outcome: TryOutcome,
        checkpoint: dict[str, object] | None,
        waiting_for: str | None = None,
        waiting_key: str | None = None,
    ) -> datetime | None:
        async with self._sessions() as session, session.begin():
            return await jobs.retry_later(
                session,
                claim.job.job_id,
                claim.try_no,
                delay=timedelta(seconds=delay),
                error=error,
                summary=summary,
                outcome=outcome,
                checkpoint=checkpoint,
                waiting_for=waiting_for,
                waiting_key=waiting_key,
            )

    async def release(self, claim: Claim, reason: str) -> bool:
        async with self._sessions() as session, session.begin():
            return await jobs.release(session, claim.job.job_id, claim.try_no, reason)

    async def extend(self, claim: Claim, lease: timedelta) -> bool:
        return await self._extends.submit((claim, lease))

    async def _extend_batch(self, asks: Sequence[tuple[Claim, timedelta]]) -> list[bool]:
        held: set[uuid.UUID] = set()
        async with self._engine.connect() as connection:
            connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            by_lease: dict[timedelta, list[tuple[uuid.UUID, int]]] = {}
            for claim, lease in asks:
                by_lease.setdefault(lease, []).append((claim.job.job_id, claim.try_no))
            for lease, tries in by_lease.items():
                held |= await jobs.extend_leases(connection, tries, lease)
        return [claim.job.job_id in held for claim, _ in asks]

    async def defer(self, job_id: uuid.UUID, at: datetime) -> bool:
        async with self._sessions() as session, session.begin():
            return await jobs.schedule_message(session, job_id, at)

    async def record_usage(self, spent: TryUsage) -> None:
        await self._usage.submit(spent)

    async def _usage_batch(self, batch: Sequence[TryUsage]) -> list[None]:
        async with self._sessions() as session, session.begin():
            await ledger.insert(session, batch)
        return [None] * len(batch)
