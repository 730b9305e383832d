"""Re-register a job that failed, revive a ghost under its own job id, or give up on it.

Shared by the ghost and failed sweeps, so both apply one retry cap: `attempt` counts the
runs of a (target, type) chain, and a chain at `Policy.max_attempt` is never extended.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from san_common.jobs import lifecycle
from san_common.jobs.registration import (
    DuplicateActiveJob,
    Priority,
    register_job_in_transaction,
)
from san_recovery import repository
from san_recovery.policy import Policy
from san_recovery.repository import GAVE_UP_PREFIX, JobRow, TargetState
from san_recovery.tally import Outcome

_GIVE_UP_REASONS = {
    TargetState.MISSING: "(target no longer exists)",
    TargetState.DONE: "(target already complete)",
    TargetState.SUPERSEDED: "(superseded by a newer commit of the same content)",
}


async def retry_or_give_up(
    session: AsyncSession, job: JobRow, policy: Policy, *, ghost: str | None = None
) -> Outcome:
    """`job` is FAILED: it is followed by a new job with `attempt + 1`. Or — with `ghost`,
    the reason it is a ghost — it is still PENDING or PROCESSING: the same job (same id)
    becomes claimable again with `attempt + 1`. Unless the chain is out of attempts or the
    target makes another attempt pointless: then it ends FAILED. Runs inside the caller's
    transaction (a savepoint per job)."""
    job_type = job.job_type
    why_not = await _why_not_retry(session, job, policy)
    if why_not is None and ghost is not None:
        # A ghost keeps its job id (the one its client polls): the same row becomes
        # claimable again with `attempt` + 1 and a new message; a try still open (a hung
        # worker's) ends `lease_lost` and is fenced out.
        revived = await lifecycle.revive(session, job.job_id, from_status=job.status, reason=ghost)
        return Outcome.REGISTERED if revived else Outcome.SKIPPED  # else: settled meanwhile
    if why_not is None:

        async def register() -> None:
            # Takes the job type's per-user lock (the registry's: one active TIL per user)
            # and refuses while the user has another active job of a per-user type.
            await register_job_in_transaction(
                session,
                job_type=job_type,
                target_id=job.target_id,
                user_id=job.user_id,
                attempt=job.attempt + 1,
                priority=Priority.BATCH,  # nobody is waiting on a sweep: after their work
            )
            await lifecycle.mirror_pending(session, job_type, job.target_id)

        try:
            # Only while no newer job (an operator's retry, a user's new request) took
            # its place: the lifecycle checks that under the job's lock.
            followed = await lifecycle.follow_up(session, job.job_id, register)
        except DuplicateActiveJob:
            # Someone else registered it (the target is covered), or the user has another
            # active TIL: a later run retries once that one ended.
            return Outcome.SKIPPED
        return Outcome.REGISTERED if followed else Outcome.SKIPPED

    message = f"{GAVE_UP_PREFIX} {why_not}: {ghost or job.error_message or 'no error recorded'}"
    if not await lifecycle.give_up(
        session,
        job.job_id,
        from_status=job.status,
        message=message,
        owner_message=_owner_message(job, why_not, ghost),
    ):
        return Outcome.SKIPPED
    return Outcome.GIVEN_UP


def _owner_message(job: JobRow, why_not: str, ghost: str | None) -> str:
    """What the target row's owner reads: why recovery stopped and the last try's sanitized
    summary — never the cause chain or a ghost's worker (host) name, which the job's
    `error_message` keeps for operators."""
    last = "its worker or its message was lost" if ghost is not None else job.error_summary
    return f"{GAVE_UP_PREFIX} {why_not}" + (f": {last}" if last else "")


async def _why_not_retry(session: AsyncSession, job: JobRow, policy: Policy) -> str | None:
    if job.attempt >= policy.max_attempt:
        return f"after {job.attempt} attempts"
    state = await repository.target_state(session, job.job_type, job.target_id)
    return _GIVE_UP_REASONS.get(state)
