"""Group commit (san_common.worker.batching, SqlJobStore): the jobs of one worker that
claim or complete at the same moment share one statement and one transaction, and still
each get exactly their own outcome. Real PostgreSQL, no broker. Each test here is the
catching test of a mutation in `tests/faults/mutations.py`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import ClassVar

import asyncpg
import pytest
from asyncpg.connection import LoggedQuery
from sqlalchemy import bindparam, event, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_ai_worker.handlers.scrap_refine import ScrapRefineHandler
from san_common.db.engine import bound_engine, create_engine, create_session_factory
from san_common.jobs import lifecycle as jobs
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, Write
from san_common.worker.store import Claim, SqlJobStore
from tests.faults.harness import Seeded, job_rows, seed, try_rows
from tests.faults.test_leases import LEASE, _expire
from tests.waiting import eventually


class StoreFailed(Exception):
    pass


class WriteAnswer:
    """SCRAP_REFINE's store without its AI: writes the answer to the scrap, or raises for
    the scraps in `broken`."""

    job_type: ClassVar[str] = JobType.SCRAP_REFINE

    def __init__(self, broken: frozenset[uuid.UUID] = frozenset()) -> None:
        self.broken = broken

    async def load(self, session: AsyncSession, job: AsyncJob) -> None:
        return None

    async def run(self, job: AsyncJob, payload: None) -> str:
        return f"answer for {job.target_id}"

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        await session.execute(
            text("UPDATE scraps SET refined_content = :r WHERE id = :id"),
            {"r": result, "id": job.target_id},
        )
        if job.target_id in self.broken:
            raise StoreFailed(f"store of {job.target_id} failed")


@pytest.fixture
async def sessions(fresh_db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_engine(fresh_db_url, pool_size=5, pre_ping=False, generic_plans=True)
    try:
        yield create_session_factory(engine)
    finally:
        await engine.dispose()


async def _refined(
    sessions: async_sessionmaker[AsyncSession], scrap_ids: list[uuid.UUID]
) -> list[str | None]:
    async with sessions() as session:
        rows = dict(
            (
                await session.execute(
                    text("SELECT id, refined_content FROM scraps WHERE id = ANY(:ids)"),
                    {"ids": scrap_ids},
                )
            ).all()
        )
    return [rows[i] for i in scrap_ids]


async def _claimed(
    sessions: async_sessionmaker[AsyncSession],
    count: int,
    *,
    label: str = "group",
    worker: str = "w-batch",
) -> tuple[Seeded, SqlJobStore, list[Claim]]:
    """`count` SCRAP_REFINE jobs, and a store that claimed them all together."""
    seeded = await seed(sessions, count, [JobType.SCRAP_REFINE], label=label)
    store = SqlJobStore(sessions)
    return seeded, store, await _claim_all(store, seeded.job_ids, worker)


async def _claim_all(store: SqlJobStore, job_ids: list[uuid.UUID], worker: str) -> list[Claim]:
    got = await asyncio.gather(*(store.claim(j, worker, LEASE, reclaim_own=True) for j in job_ids))
    assert all(isinstance(c, Claim) for c in got), got
    return [c for c in got if isinstance(c, Claim)]


async def test_claims_asked_together_are_one_statement_each_with_its_own_try(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    seeded, _, claims = await _claimed(sessions, 5, worker="w-group")

    assert [c.try_no for c in claims] == [1] * 5
    rows = await job_rows(sessions, seeded.job_ids)
    assert {r["status"] for r in rows.values()} == {"PROCESSING"}
    # one statement: one transaction timestamp for the five claims
    assert len({r["started_at"] for r in rows.values()}) == 1
    tries = await try_rows(sessions, seeded.job_ids)
    assert sorted((t["job_id"], t["try_no"], t["outcome"]) for t in tries) == sorted(
        (str(j), 1, None) for j in seeded.job_ids
    )


@pytest.mark.parametrize("on_driver", [False, True], ids=["session", "driver"])
async def test_a_batch_with_a_taken_over_try_completes_the_others_and_not_that_one(
    sessions: async_sessionmaker[AsyncSession], on_driver: bool
) -> None:
    """Through a session (a handler's `store`) and on the driver (a one-statement `write`,
    which the store runs without SQLAlchemy): either way the taken-over try's write never
    commits, and the others' do."""
    seeded, store, claims = await _claimed(sessions, 3)
    lost = seeded.job_ids[1]
    await _expire(sessions, lost)
    async with sessions() as session, session.begin():
        assert await jobs.claim(session, lost, "w-other", LEASE) is not None

    handler = SharedAnswer() if on_driver else WriteAnswer()
    seen = _statements(sessions)
    finished = await asyncio.gather(
        *(store.finish(c, handler, f"answer {i}") for i, c in enumerate(claims))
    )

    assert finished == [True, False, True]
    assert await _refined(sessions, seeded.scrap_ids) == ["answer 0", None, "answer 2"]
    rows = await job_rows(sessions, seeded.job_ids)
    assert [rows[j]["status"] for j in seeded.job_ids] == ["COMPLETED", "PROCESSING", "COMPLETED"]
    assert (rows[lost]["tries"], rows[lost]["worker_id"]) == (2, "w-other")
    writes = {source for sql, source, _ in seen if sql.startswith("UPDATE scraps")}
    assert writes == {"driver" if on_driver else "sqlalchemy"}


async def test_a_batch_with_a_failing_store_fails_only_that_job(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    seeded, store, claims = await _claimed(sessions, 3)
    handler = WriteAnswer(broken=frozenset({seeded.scrap_ids[2]}))

    finished = await asyncio.gather(
        *(store.finish(c, handler, f"answer {i}") for i, c in enumerate(claims)),
        return_exceptions=True,
    )

    assert finished[:2] == [True, True]
    assert isinstance(finished[2], StoreFailed)
    assert await _refined(sessions, seeded.scrap_ids) == ["answer 0", "answer 1", None]
    rows = await job_rows(sessions, seeded.job_ids)
    assert [rows[j]["status"] for j in seeded.job_ids] == ["COMPLETED", "COMPLETED", "PROCESSING"]


class SharedAnswer(JobHandler[None, str]):
    """A handler whose results are one statement (`write`): an empty answer fails it in
    the database (division by zero), whichever job of a batch it belongs to."""

    job_type: ClassVar[str] = JobType.SCRAP_REFINE

    async def run(self, job: AsyncJob, payload: None) -> str:
        raise AssertionError("the store tests run no job")

    def write(self, job: AsyncJob, result: str) -> Write:
        return Write(WRITE_ANSWER, {"r": result, "id": job.target_id})


WRITE_ANSWER = text(
    "UPDATE scraps SET refined_content = :r "
    "WHERE id = :id AND 1 / length(CAST(:r AS text)) IS NOT NULL"
)


def _statements(sessions: async_sessionmaker[AsyncSession]) -> list[tuple[str, str, int]]:
    """Every statement run from now on, through SQLAlchemy or on the driver alone (the
    store runs one-statement writes there): (SQL, "sqlalchemy" or "driver", parameter
    sets). SQLAlchemy's statements reach the driver too: those are SQLAlchemy's."""
    seen: list[tuple[str, str, int]] = []
    engine = bound_engine(sessions).sync_engine

    def note(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        seen.append((statement, "sqlalchemy", len(parameters) if executemany else 1))

    def on_driver(query: LoggedQuery) -> None:
        if any(sql == query.query and source == "sqlalchemy" for sql, source, _ in seen):
            return
        # executemany logs its list of parameter sets; execute, its tuple of parameters
        many = isinstance(query.args, list)
        seen.append((query.query, "driver", len(query.args) if many else 1))

    def log_driver(dbapi_connection, record, proxy) -> None:  # type: ignore[no-untyped-def]
        proxy.driver_connection.add_query_logger(on_driver)

    event.listen(engine, "before_cursor_execute", note)
    event.listen(engine, "checkout", log_driver)
    return seen


async def test_the_writes_of_a_batch_are_one_executemany_and_every_job_completes(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    seeded, store, claims = await _claimed(sessions, 4)
    handler = ScrapRefineHandler(ai=None)  # type: ignore[arg-type]  # its write calls no AI
    seen = _statements(sessions)

    finished = await asyncio.gather(
        *(store.finish(c, handler, f"answer {i}") for i, c in enumerate(claims))
    )

    assert finished == [True] * 4
    assert await _refined(sessions, seeded.scrap_ids) == [f"answer {i}" for i in range(4)]
    rows = await job_rows(sessions, seeded.job_ids)
    assert {rows[j]["status"] for j in seeded.job_ids} == {"COMPLETED"}
    writes = [(source, sets) for sql, source, sets in seen if sql.startswith("UPDATE scraps")]
    assert writes == [("driver", 4)]


class JsonAnswer(JobHandler[None, dict[str, str]]):
    """A one-statement write with a parameter SQLAlchemy converts on the way (JSONB): the
    store runs it through SQLAlchemy, not on the driver, which would not convert it."""

    job_type: ClassVar[str] = JobType.SCRAP_REFINE

    async def run(self, job: AsyncJob, payload: None) -> dict[str, str]:
        raise AssertionError("the store tests run no job")

    def write(self, job: AsyncJob, result: dict[str, str]) -> Write:
        return Write(WRITE_JSON, {"id": job.target_id, "answer": result})


WRITE_JSON = text("INSERT INTO json_answers (id, answer) VALUES (:id, :answer)").bindparams(
    bindparam("answer", type_=JSONB)
)


@pytest.mark.parametrize("count", [1, 3])
async def test_a_write_whose_parameters_sqlalchemy_converts_goes_through_sqlalchemy(
    sessions: async_sessionmaker[AsyncSession], count: int
) -> None:
    seeded, store, claims = await _claimed(sessions, count)
    async with sessions() as session, session.begin():
        await session.execute(text("CREATE TABLE json_answers (id uuid PRIMARY KEY, answer jsonb)"))
    seen = _statements(sessions)

    finished = await asyncio.gather(
        *(store.finish(c, JsonAnswer(), {"answer": str(i)}) for i, c in enumerate(claims))
    )

    assert finished == [True] * count
    async with sessions() as session:
        stored = dict((await session.execute(text("SELECT id, answer FROM json_answers"))).all())
    assert stored == {s: {"answer": str(i)} for i, s in enumerate(seeded.scrap_ids)}
    inserts = {source for sql, source, _ in seen if sql.startswith("INSERT INTO json_answers")}
    assert inserts == {"sqlalchemy"}


async def test_a_shared_write_that_fails_fails_only_the_job_it_was_for(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    seeded, store, claims = await _claimed(sessions, 3)

    answers = ["a0", "", "a2"]  # the empty one fails its write
    finished = await asyncio.gather(
        *(store.finish(c, SharedAnswer(), a) for c, a in zip(claims, answers, strict=True)),
        return_exceptions=True,
    )

    assert finished[0] is True and finished[2] is True
    # the driver's own error: the store runs one-statement writes on the driver
    assert isinstance(finished[1], asyncpg.DivisionByZeroError), finished[1]
    assert "division by zero" in str(finished[1])
    assert await _refined(sessions, seeded.scrap_ids) == ["a0", None, "a2"]
    rows = await job_rows(sessions, seeded.job_ids)
    assert [rows[j]["status"] for j in seeded.job_ids] == ["COMPLETED", "PROCESSING", "COMPLETED"]


async def test_a_claim_whose_caller_is_cancelled_mid_statement_is_released(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """Shutdown cancels a job while its batch's claim is in the database: the claim still
    commits, and nobody would run the job until its lease ran out — so it is released."""
    seeded = await seed(sessions, 1, [JobType.SCRAP_REFINE], label="group")
    (job_id,) = seeded.job_ids
    store = SqlJobStore(sessions)
    async with sessions() as blocker:
        await blocker.begin()
        # hold the job row: the claim's UPDATE waits for this transaction
        await blocker.execute(
            text("SELECT 1 FROM async_jobs WHERE job_id = :id FOR UPDATE"), {"id": job_id}
        )
        claiming = asyncio.create_task(store.claim(job_id, "w-cancel", LEASE, reclaim_own=True))

        async def claim_waits_on_the_row() -> bool:
            async with sessions() as session:
                waiting = await session.scalar(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE '%claimed AS%' AND datname = current_database()"
                    )
                )
            return bool(waiting)

        await eventually(claim_waits_on_the_row, within=20, what="the claim waits on the held row")
        claiming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claiming
        await blocker.rollback()

    async def released() -> bool:
        row = (await job_rows(sessions, [job_id]))[job_id]
        return row["status"] == "PENDING"

    await eventually(released, within=20, what="the abandoned claim released")
    tries = await try_rows(sessions, [job_id])
    assert [(t["try_no"], t["outcome"]) for t in tries] == [(1, "released")]


class LockTwoScraps(WriteAnswer):
    """`WriteAnswer` that also writes `other[target]` — the write a handler would make to a
    row another job also writes (a shared tag, a user's counters). With `both_hold`, each
    store's first run waits there once it holds its own scrap: two of them, on two
    workers, then lock the same rows in opposite orders — a deadlock every time."""

    def __init__(
        self, other: dict[uuid.UUID, uuid.UUID], both_hold: asyncio.Barrier | None = None
    ) -> None:
        super().__init__()
        self.other = other
        self.both_hold = both_hold

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        write = text("UPDATE scraps SET refined_content = :r WHERE id = :id")
        await session.execute(write, {"r": result, "id": job.target_id})
        if (both_hold := self.both_hold) is not None:
            await both_hold.wait()
            self.both_hold = None  # once: the store run again after the deadlock goes on
        if (other := self.other.get(job.target_id)) is not None:
            await session.execute(write, {"r": result, "id": other})


async def _completed_on_their_first_try(
    sessions: async_sessionmaker[AsyncSession], job_ids: list[uuid.UUID]
) -> None:
    rows = await job_rows(sessions, job_ids)
    assert {(r["status"], r["tries"]) for r in rows.values()} == {("COMPLETED", 1)}, rows
    tries = await try_rows(sessions, job_ids)
    assert [(t["try_no"], t["outcome"]) for t in tries] == [(1, "completed")] * len(job_ids)


async def test_a_completion_that_loses_a_deadlock_to_another_worker_is_run_again(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """PostgreSQL rolls one of two deadlocked transactions back (after `deadlock_timeout`,
    1 s): that job's store runs again, its try is not spent."""
    seeded = await seed(sessions, 2, [JobType.SCRAP_REFINE], label="deadlock")
    x, y = seeded.scrap_ids
    worker_a, worker_b = SqlJobStore(sessions), SqlJobStore(sessions)
    (claim_x,) = await _claim_all(worker_a, seeded.job_ids[:1], "w-a")
    (claim_y,) = await _claim_all(worker_b, seeded.job_ids[1:], "w-b")
    handler = LockTwoScraps({x: y, y: x}, asyncio.Barrier(2))

    finished = await asyncio.gather(
        worker_a.finish(claim_x, handler, "a"),
        worker_b.finish(claim_y, handler, "b"),
        return_exceptions=True,
    )

    assert finished == [True, True]
    await _completed_on_their_first_try(sessions, seeded.job_ids)


async def test_a_batch_that_loses_a_deadlock_in_its_completion_runs_each_job_again(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    """The deadlock in the runtime's own completion statement, not in a store: an operator's
    transaction holds a job row of the batch (as a cancel would) and, once the batch waits
    for it, wants a row the batch's stores wrote. The batch waited first, so its backend
    detects the cycle and is the one rolled back; its jobs complete again, one transaction
    each."""
    seeded, store, claims = await _claimed(sessions, 2, label="deadlock-batch")
    handler = LockTwoScraps({})

    holding = asyncio.Event()

    async def batch_waits_for_a_lock() -> bool:
        async with sessions() as session:
            waiting = await session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%async_jobs%' AND pid <> pg_backend_pid()"
                )
            )
        return bool(waiting)

    async def operator() -> None:
        async with sessions() as session, session.begin():
            await session.execute(
                text("UPDATE async_jobs SET updated_at = now() WHERE job_id = :id"),
                {"id": seeded.job_ids[0]},
            )
            holding.set()
            # the batch's stores hold both scraps and its completion waits for this row
            await eventually(batch_waits_for_a_lock, what="the batch to wait for the job row")
            await session.execute(
                text("UPDATE scraps SET content = content WHERE id = :id"),
                {"id": seeded.scrap_ids[1]},
            )

    operating = asyncio.create_task(operator())
    await holding.wait()
    finished = await asyncio.gather(*(store.finish(c, handler, "r") for c in claims))
    await operating

    assert finished == [True, True]
    await _completed_on_their_first_try(sessions, seeded.job_ids)
