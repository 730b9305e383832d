"""Registering a job: the `async_jobs` row and its outbox row, always in one transaction.

Two modes, as in the seed (docs/reference/job-rules.md §2.3):
- `register_job_in_transaction` joins the caller's open transaction (the seed's MANDATORY)
  and raises `TransactionRequired` if there is none; `register_job_on_connection` is the
  same for a caller whose transaction is on an asyncpg connection (the API's hot write
  path, which runs no ORM session);
- `register_job` opens and commits a transaction of its own (the seed's REQUIRES_NEW).

Each takes the job's `priority` class (jobs/admission.py): interactive by default — a user
waits on it — and batch for the daily TIL batch and recovery's re-registrations. The
outbox row carries it with the user, for the relay's fair admission.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from san_common import metrics
from san_common.db.engine import bound_engine, driver_connection
from san_common.jobs import registry
from san_common.jobs.admission import Priority
from san_common.jobs.envelope import JobMessage
from san_common.jobs.outbox import JOBS_EXCHANGE, new_job_message
from san_common.jobs.publishing import DirectRows, Pending

__all__ = [
    "JOBS_EXCHANGE",
    "ActiveJobForUser",
    "DuplicateActiveJob",
    "Priority",
    "RegisteredJob",
    "TransactionRequired",
    "lock_user",
    "register_job",
    "register_job_in_transaction",
    "register_job_on_connection",
]


class TransactionRequired(RuntimeError):
    """Job registration in the caller's transaction was asked for outside a transaction."""


class DuplicateActiveJob(Exception):
    """An active (PENDING or PROCESSING) job already exists for this target and type."""

    def __init__(self, job_type: str, target_id: uuid.UUID) -> None:
        super().__init__(f"an active {job_type} job already exists for target {target_id}")
        self.job_type = job_type
        self.target_id = target_id


class ActiveJobForUser(DuplicateActiveJob):
    """The job type allows one active job per user (its registry entry names a user lock),
    and the user has one: `job_id`."""

    def __init__(self, job_type: str, target_id: uuid.UUID, job_id: uuid.UUID) -> None:
        super().__init__(job_type, target_id)
        self.active_job_id = job_id


@dataclass(frozen=True)
class RegisteredJob:
    job_id: uuid.UUID
    job_type: str
    target_id: uuid.UUID
    message_id: uuid.UUID


async def register_job_in_transaction(
    session: AsyncSession,
    *,
    job_type: str,
    target_id: uuid.UUID,
    user_id: uuid.UUID,
    attempt: int = 1,
    priority: Priority = Priority.INTERACTIVE,
) -> RegisteredJob:
    """Add the job and its outbox message to the caller's open transaction.

    Raises `DuplicateActiveJob` when the partial unique index already holds an active job
    for (target, type). The conflict is resolved by `ON CONFLICT DO NOTHING`, so the
    caller's transaction stays usable either way.
    """
    if not session.in_transaction():
        raise TransactionRequired(
            "register_job_in_transaction needs an open transaction; use register_job instead"
        )
    spec = registry.spec_for(job_type)
    connection = await session.connection()
    if spec.user_lock is not None:
        # The job type's per-user rule (one active TIL_GENERATION per user) needs every
        # registration for the user serialized; a caller that checked the rule under the
        # lock already holds it (advisory locks are re-entrant within a transaction).
        await lock_user(session, spec.user_lock, user_id)
        found = await connection.exec_driver_sql(_ACTIVE_FOR_USER, (user_id, str(job_type)))
        active = found.scalar()
        if active is not None:
            raise ActiveJobForUser(job_type, target_id, active)
    registered = await _insert(connection, job_type, target_id, user_id, attempt, priority)
    # Counted when added to the transaction: a caller that rolls back afterwards (rare:
    # the caller's own later failure) is counted too.
    metrics.JOBS_REGISTERED.labels(str(job_type)).inc()
    return registered


async def register_job_on_connection(
    connection: asyncpg.Connection,
    *,
    job_type: str,
    target_id: uuid.UUID,
    user_id: uuid.UUID,
    attempt: int = 1,
    priority: Priority = Priority.INTERACTIVE,
    direct: DirectRows | None = None,
) -> RegisteredJob:
    """`register_job_in_transaction` for a transaction on an asyncpg connection: the same
    statements, the same rules, the same errors.

    With `direct` (a process that publishes after its commit: the API), the message is the
    caller's to publish when the user has no other active job of this type: it is added to
    `direct` and inserted due only after its grace, the relay's fallback. The user's other
    jobs of the type wait for the relay's fair window (docs/architecture.md, "Direct
    publish"). Decided in the registration's one statement."""
    if not connection.is_in_transaction():
        raise TransactionRequired(
            "register_job_on_connection needs an open transaction; use register_job instead"
        )
    spec = registry.spec_for(job_type)
    if spec.user_lock is not None:  # see register_job_in_transaction
        await connection.execute(_LOCK_USER, f"{spec.user_lock}{user_id}")
        active = await connection.fetchval(_ACTIVE_FOR_USER, user_id, str(job_type))
        if active is not None:
            raise ActiveJobForUser(job_type, target_id, active)
    registered = await _insert_on(
        connection, job_type, target_id, user_id, attempt, priority, direct
    )
    metrics.JOBS_REGISTERED.labels(str(job_type)).inc()
    return registered


async def register_job(
    session_factory: async_sessionmaker[AsyncSession],
    *,
    job_type: str,
    target_id: uuid.UUID,
    user_id: uuid.UUID,
    attempt: int = 1,
    priority: Priority = Priority.INTERACTIVE,
    direct: DirectRows | None = None,
) -> RegisteredJob:
    """Register a job in a transaction of its own and commit it. With `direct`, as
    `register_job_on_connection`: the caller publishes a user's first active job of the
    type itself, after this returns (the commit)."""
    if registry.spec_for(job_type).user_lock is not None:  # lock, check, insert: together
        async with session_factory() as session, session.begin():
            return await register_job_in_transaction(
                session,
                job_type=job_type,
                target_id=target_id,
                user_id=user_id,
                attempt=attempt,
                priority=priority,
            )
    # One statement is the whole registration: atomic without a transaction around it, so
    # it runs on the pooled connection's asyncpg driver in autocommit, without SQLAlchemy's
    # execution path (a third of the registration's CPU, docs/hot-paths.md).
    async with driver_connection(bound_engine(session_factory)) as connection:
        registered = await _insert_on(
            connection, job_type, target_id, user_id, attempt, priority, direct
        )
    metrics.JOBS_REGISTERED.labels(str(job_type)).inc()
    return registered


# The job row and its outbox message in one statement (one round trip). A target that
# already has an active job of the type inserts nothing: the partial unique index's
# conflict is skipped (never raised, so the caller's transaction stays usable), and with
# no job row there is no message either.
_JOB = """
WITH job AS (
    INSERT INTO async_jobs (job_id, job_type, target_id, user_id, attempt)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (target_id, job_type) WHERE status IN ('PENDING', 'PROCESSING') DO NOTHING
    RETURNING job_id
)"""
_REGISTER = (
    _JOB
    + """
INSERT INTO outbox_messages (message_id, exchange, routing_key, body, headers, user_id, priority)
SELECT $6, $7, $2, $8::jsonb, '{}'::jsonb, $4, $9 FROM job
RETURNING id
"""
)

# The same, for a caller that publishes after its commit: the message is the caller's
# (`direct`, due only after the grace $10 seconds) when the user has no other active job of
# the type (the statement's snapshot does not see the job it inserts; the index on
# async_jobs (user_id, job_type, status) answers). A user's first active job of a type
# skips the relay; the rest of a burst waits for the relay's fair window. The stored
# envelope comes back only for a row the caller publishes (jsonb's text: the bytes the
# relay would publish); the relay's rows need it not here.
_REGISTER_DIRECT = (
    _JOB
    + """, alone AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM async_jobs a
        WHERE a.user_id = $4 AND a.job_type = $2 AND a.status IN ('PENDING', 'PROCESSING')
    ) AS direct
)
INSERT INTO outbox_messages
    (message_id, exchange, routing_key, body, headers, user_id, priority, available_at, direct)
SELECT $6, $7, $2, $8::jsonb, '{}'::jsonb, $4, $9,
       CASE WHEN alone.direct THEN now() + make_interval(secs => $10::float8) ELSE now() END,
       alone.direct
FROM job CROSS JOIN alone
RETURNING id, direct, CASE WHEN direct THEN body::text END AS body, created_at
"""
)


_LOCK_USER = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
_ACTIVE_FOR_USER = """
SELECT job_id FROM async_jobs
WHERE user_id = $1 AND job_type = $2 AND status IN ('PENDING', 'PROCESSING')
LIMIT 1
"""


def _new_message(
    job_type: str, target_id: uuid.UUID, user_id: uuid.UUID, attempt: int
) -> JobMessage:
    registry.spec_for(job_type)  # an unknown job type is refused before anything is written
    return new_job_message(
        job_id=uuid.uuid4(),
        job_type=str(job_type),
        target_id=target_id,
        user_id=user_id,
        attempt=attempt,
    )


def _register_params(message: JobMessage, priority: Priority) -> tuple[object, ...]:
    return (
        message.job_id,
        message.job_type,
        message.target_id,
        message.user_id,
        message.attempt,
        message.message_id,
        JOBS_EXCHANGE,
        message.model_dump_json(),
        int(priority),
    )


async def _insert(
    connection: AsyncConnection,
    job_type: str,
    target_id: uuid.UUID,
    user_id: uuid.UUID,
    attempt: int,
    priority: Priority,
) -> RegisteredJob:
    message = _new_message(job_type, target_id, user_id, attempt)
    result = await connection.exec_driver_sql(_REGISTER, _register_params(message, priority))
    if result.first() is None:
        raise DuplicateActiveJob(job_type, target_id)
    return RegisteredJob(message.job_id, job_type, target_id, message.message_id)


async def _insert_on(
    connection: asyncpg.Connection,
    job_type: str,
    target_id: uuid.UUID,
    user_id: uuid.UUID,
    attempt: int,
    priority: Priority,
    direct: DirectRows | None = None,
) -> RegisteredJob:
    message = _new_message(job_type, target_id, user_id, attempt)
    params = _register_params(message, priority)
    if priority is not Priority.INTERACTIVE:
        direct = None  # batch work waits for the relay's fair window
    if direct is None:
        if await connection.fetchval(_REGISTER, *params) is None:
            raise DuplicateActiveJob(job_type, target_id)
        return RegisteredJob(message.job_id, job_type, target_id, message.message_id)
    row = await connection.fetchrow(_REGISTER_DIRECT, *params, direct.grace_seconds)
    if row is None:
        raise DuplicateActiveJob(job_type, target_id)
    if row["direct"]:
        direct.rows.append(
            Pending(
                id=row["id"],
                message_id=message.message_id,
                exchange=JOBS_EXCHANGE,
                routing_key=str(job_type),
                body=row["body"].encode(),  # the bytes the relay would publish
                headers={},
                created_at=row["created_at"],
                traceparent=message.traceparent,
                tracestate=message.tracestate,
            )
        )
    return RegisteredJob(message.job_id, job_type, target_id, message.message_id)


async def lock_user(session: AsyncSession, namespace: str, user_id: uuid.UUID) -> None:
    """Wait for, then hold until the end of the caller's transaction, the advisory lock
    `namespace` + user. Keys are 64-bit hashes: a collision only makes two users wait for
    each other."""
    connection = await session.connection()
    await connection.exec_driver_sql(_LOCK_USER, (f"{namespace}{user_id}",))
