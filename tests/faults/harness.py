"""What the fault tests share: services as OS processes the test can kill, pause and restart
(as a supervisor would), jobs seeded straight through `register_job`, the job rows read
back, the services' logs scanned, and each test's figures written down."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import Scrap, User
from tests.conftest import JWT_SECRET, TOKEN_KEYS
from tests.faults.gated_ai import GatedAi
from tests.procs import ServiceProcess, start


@dataclass
class FaultStack:
    """Relay and workers as OS processes over one database, one broker prefix, one AI."""

    db_url: str
    amqp_url: str
    prefix: str
    ai: GatedAi
    log_dir: Path
    processes: list[ServiceProcess] = field(default_factory=list)
    _serial: int = 0

    def env(self, **overrides: str) -> dict[str, str]:
        return {
            "DATABASE_URL": self.db_url,
            "AMQP_URL": self.amqp_url,
            "AMQP_PREFIX": self.prefix,
            "AUTH_JWT_SECRET": JWT_SECRET,
            "TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS,
            "SAN_ENV": "test",
            "LOG_FORMAT": "json",
            "DATA_DIR": str(self.log_dir / "data"),
            "AI_PROVIDER": "openai",
            "AI_BASE_URL": self.ai.base_url,
            "AI_API_KEY": "sk-faults",
            # Long enough that no AI call held at the gate times out on its own.
            "AI_TIMEOUT_SECONDS": "120",
            "WORKER_BACKOFF_SECONDS": "0.05",
            **overrides,
        }

    def start(self, service: str, **overrides: str) -> ServiceProcess:
        """Start `service`; a second one of the same kind gets its own log file."""
        self._serial += 1
        name = f"{service}-{self._serial}"
        process = start(name, self.env(**overrides), self.log_dir, module=_MODULES[service])
        self.processes.append(process)
        return process

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()[-tail:]}" for p in self.processes)

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            if process.popen.poll() is None:
                resume(process)  # a paused process cannot act on SIGTERM
            process.terminate(timeout=20)


_MODULES = {
    "api": "san_api.main",
    "relay": "san_relay.main",
    "ai-worker": "san_ai_worker.main",
    "recovery": "san_recovery.main",
}


def pause(process: ServiceProcess) -> None:
    os.kill(process.popen.pid, signal.SIGSTOP)


def resume(process: ServiceProcess) -> None:
    os.kill(process.popen.pid, signal.SIGCONT)


# -- jobs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    scrap_ids: list[uuid.UUID]
    job_ids: list[uuid.UUID]


async def seed(
    sessions: async_sessionmaker[AsyncSession],
    scraps: int,
    job_types: Iterable[JobType] = (JobType.CARD_ANALYSIS,),
    *,
    label: str = "fault",
) -> Seeded:
    """`scraps` scraps of one new user, and for each a job of every type in `job_types`,
    registered as the API does (job row + outbox row in one transaction)."""
    types = list(job_types)
    async with sessions() as session, session.begin():
        user_id = await session.scalar(
            insert(User).values(external_id=f"{label}-{uuid.uuid4().hex}").returning(User.id)
        )
        rows = []
        for i in range(scraps):
            content = f"{label} scrap {i}: leases, fencing tokens and redelivery {uuid.uuid4()}"
            rows.append(
                Scrap(
                    user_id=user_id,
                    content=content,
                    content_hash=hashlib.sha256(content.encode()).hexdigest(),
                )
            )
        session.add_all(rows)
    assert user_id is not None
    job_ids = []
    for scrap in rows:
        for job_type in types:
            job = await register_job(
                sessions, job_type=job_type, target_id=scrap.id, user_id=user_id
            )
            job_ids.append(job.job_id)
    return Seeded([s.id for s in rows], job_ids)


async def job_rows(
    sessions: async_sessionmaker[AsyncSession], job_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, dict[str, Any]]:
    """Every column of each job row (whatever columns the runtime has), by job id."""
    async with sessions() as session:
        result = await session.execute(
            text("SELECT job_id, to_jsonb(j) AS row FROM async_jobs j WHERE job_id = ANY(:ids)"),
            {"ids": list(job_ids)},
        )
        return {row.job_id: dict(row.row) for row in result}


async def statuses(
    sessions: async_sessionmaker[AsyncSession], job_ids: Iterable[uuid.UUID]
) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in (await job_rows(sessions, job_ids)).values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


async def jobs_for_targets(
    sessions: async_sessionmaker[AsyncSession], target_ids: Iterable[uuid.UUID]
) -> int:
    """How many job rows exist for these targets (re-registration would add some)."""
    async with sessions() as session:
        return int(
            await session.scalar(
                text("SELECT count(*) FROM async_jobs WHERE target_id = ANY(:ids)"),
                {"ids": list(target_ids)},
            )
            or 0
        )


async def cards_per_scrap(
    sessions: async_sessionmaker[AsyncSession], scrap_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, int]:
    ids = list(scrap_ids)
    async with sessions() as session:
        result = await session.execute(
            text(
                "SELECT s.id, count(k.id) AS cards FROM scraps s"
                " LEFT JOIN knowledge_cards k ON k.scrap_id = s.id"
                " WHERE s.id = ANY(:ids) GROUP BY s.id"
            ),
            {"ids": ids},
        )
        return {row.id: int(row.cards) for row in result}


async def held_by(
    sessions: async_sessionmaker[AsyncSession], job_ids: Iterable[uuid.UUID], pid: int
) -> int:
    """PROCESSING jobs whose worker id names process `pid` (`host:pid:suffix`)."""
    rows = (await job_rows(sessions, job_ids)).values()
    return sum(
        1 for r in rows if r["status"] == "PROCESSING" and f":{pid}:" in (r["worker_id"] or "")
    )


async def run_sql(url: str, script: str) -> Any:
    """Run a script (several statements, e.g. a test-only trigger) on its own connection;
    the value of its first column, for a single query."""
    import asyncpg

    from san_common.db.engine import plain_url

    connection = await asyncpg.connect(plain_url(url))
    try:
        if script.lstrip().upper().startswith("SELECT"):
            return await connection.fetchval(script)
        return await connection.execute(script)
    finally:
        await connection.close()


def killing_trigger(name: str, first: int) -> str:
    """SQL for the trigger function `<name>()` and its counter, the sequence `<name>`: the
    first `first` rows it fires for terminate their own backend mid-statement — the writing
    connection dies as under `pg_terminate_backend` or a crash. A sequence counts them
    because it is not rolled back with the transaction it ran in (`SELECT last_value FROM
    <name>` tells how many writes came). Attach it with `CREATE TRIGGER … EXECUTE FUNCTION
    <name>()`."""
    return f"""
CREATE SEQUENCE {name};
CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('{name}') <= {first} THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(5);
    END IF;
    RETURN NEW;
END $$;
"""


# -- logs ------------------------------------------------------------------------------------


def json_lines(log: str) -> Iterator[dict[str, Any]]:
    for line in log.splitlines():
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(parsed, dict):
            yield parsed


def log_problems(log: str) -> list[str]:
    """Lines that show an error escaped the runtime's handling: anything that is not one of
    its JSON lines (a bare traceback on stderr), any error-level line (asyncio's "Task
    exception was never retrieved" is one), any line carrying a traceback."""
    problems = []
    for line in log.splitlines():
        if not line.strip():
            continue
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            problems.append(line)
            continue
        if not isinstance(parsed, dict):
            problems.append(line)
        elif parsed.get("level") in ("error", "critical") or "exc" in parsed:
            problems.append(line[:2000])
    return problems


# -- figures ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """One row of docs/reliability.md's fault table."""

    test: str
    jobs: int
    fault: str
    completed: int
    lost: int
    duplicated: int
    time_to_heal_s: float


def record(figures: Figures, tmp_path: Path) -> None:
    """Write the figures next to the test's logs, print them, and append them to the file
    `FAULT_FIGURES` names (how the table in docs/reliability.md is collected). Not `SAN_…`:
    the services report unknown variables with their prefixes, and they inherit this one."""
    line = json.dumps(asdict(figures))
    (tmp_path / "figures.json").write_text(line + "\n")
    print(f"fault figures: {line}")
    if target := os.environ.get("FAULT_FIGURES"):
        with open(target, "a") as out:
            out.write(line + "\n")


async def card_ids(
    sessions: async_sessionmaker[AsyncSession], scrap_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, list[uuid.UUID]]:
    async with sessions() as session:
        result = await session.execute(
            text(
                "SELECT scrap_id, array_agg(id ORDER BY id) AS ids FROM knowledge_cards"
                " WHERE scrap_id = ANY(:ids) GROUP BY scrap_id"
            ),
            {"ids": list(scrap_ids)},
        )
        return {row.scrap_id: list(row.ids) for row in result}


async def try_rows(
    sessions: async_sessionmaker[AsyncSession], job_ids: Iterable[uuid.UUID]
) -> list[dict[str, Any]]:
    """Every `async_job_tries` row of these jobs, oldest try first."""
    async with sessions() as session:
        result = await session.execute(
            text(
                "SELECT to_jsonb(t) AS row FROM async_job_tries t WHERE job_id = ANY(:ids)"
                " ORDER BY job_id, try_no"
            ),
            {"ids": list(job_ids)},
        )
        return [dict(row.row) for row in result]
