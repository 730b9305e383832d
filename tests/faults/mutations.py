"""Mutation runner for issue 9's acceptance 4: each mutation below breaks one guarantee of
the job runtime; the suite must turn red for each. The runner copies the working tree
(tracked and untracked, not ignored files) to a temporary directory, applies one mutation
there, runs the tests named as its catchers with that copy first on `sys.path`, and reports
caught / survived. The checkout itself is never touched.

    make mutants                                  # or: uv run python -m tests.faults.mutations
    uv run python -m tests.faults.mutations --only fencing --keep

A mutation whose original text is no longer in the code is reported `stale` (the code
moved on: update the mutation), never silently skipped. Not part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LIFECYCLE = "libs/common/src/san_common/jobs/lifecycle.py"
TRANSITIONS_MIGRATION = (
    "libs/common/src/san_common/db/migrations/versions/0016_transitions_check_linear.py"
)
LIFECYCLE_TESTS = "tests/worker/test_lifecycle.py"
SUPERSEDED_TESTS = "tests/admin/test_superseded.py"
STORE = "libs/common/src/san_common/worker/store.py"
EXECUTOR = "libs/common/src/san_common/worker/executor.py"
TOPOLOGY = "libs/common/src/san_common/broker/topology.py"
RELAY = "services/relay/src/san_relay/relay.py"
RELAY_WINDOW = "services/relay/src/san_relay/window.py"
RELAY_REPO = "services/relay/src/san_relay/repository.py"
BULK_LANE = "tests/relay/test_bulk_lane.py"
COMPAT = "libs/common/src/san_common/compat.py"
LEASES = "tests/faults/test_leases.py"
GUARDS = "tests/faults/test_guards.py"
GROUP = "tests/faults/test_group_commit.py"
LEASES_KEEPER = "libs/common/src/san_common/worker/leases.py"
LOGS = "libs/common/src/san_common/logs.py"
ERRORS = "libs/common/src/san_common/errors.py"
LOG_SECRETS = (
    "tests/observability/test_logs.py::test_a_secret_of_any_shape_is_redacted_wherever_it"
    "_sits_in_a_json_line"
)
TOKEN_CACHE = "services/api/src/san_api/auth/cache.py"
TOKENS = "services/api/src/san_api/auth/tokens.py"
STREAM_SLOTS = "services/api/src/san_api/job_events/slots.py"
JOB_EVENTS_ENDPOINT = "services/api/src/san_api/job_events/endpoints.py"
CSRF = "services/api/src/san_api/admin/csrf.py"
GITHUB_ENDPOINTS = "services/api/src/san_api/github/endpoints.py"
NEAREST = "libs/common/src/san_common/db/migrations/versions/0006_nearest_cards.py"
OUTBOX_CLAIM = "libs/common/src/san_common/db/migrations/versions/0008_outbox_claim.py"
API_DEPS = "services/api/src/san_api/deps.py"
API_EDGE = "services/api/src/san_api/edge.py"
API_ERRORS = "services/api/src/san_api/errors.py"
API_LIMITS = "services/api/src/san_api/limits/dependencies.py"
API_APP = "services/api/src/san_api/app.py"
ADMIN_BROKER = "services/api/src/san_api/admin/broker.py"
ENGINE = "libs/common/src/san_common/db/engine.py"
WORKER_SETTINGS = "libs/common/src/san_common/worker/settings.py"
RELAY_SETTINGS = "services/relay/src/san_relay/settings.py"
RECOVERY_SETTINGS = "services/recovery/src/san_recovery/settings.py"
RECOVERY_REPO = "services/recovery/src/san_recovery/repository.py"
RECOVERY_RUNNER = "services/recovery/src/san_recovery/runner.py"
REQUESTS = "tests/recovery/test_requests.py"
GITHUB_LOCKS = "services/github-worker/src/san_github_worker/locks.py"
EVENT_HUB = "services/api/src/san_api/job_events/hub.py"
CONSUMER = "libs/common/src/san_common/worker/consumer.py"
JOB_EVENTS = "libs/common/src/san_common/db/migrations/versions/0009_job_events_per_statement.py"
TIMEOUTS = "tests/worker/test_database_timeouts.py"
PARTITIONS = "tests/faults/test_partitions.py"
CLAIM_ERRORS = "tests/faults/test_claim_errors.py"
STRANDED = "services/recovery/src/san_recovery/stranded.py"
STRANDED_TESTS = "tests/faults/test_stranded.py"
FAIR_SHARE_MIGRATION = "libs/common/src/san_common/db/migrations/versions/0018_fair_share.py"
FAIR_SHARE = "tests/faults/test_fair_share.py"
MAINTENANCE_TESTS = "tests/recovery/test_maintenance.py"
OUTAGES = "libs/common/src/san_common/outages.py"
REGISTRY = "libs/common/src/san_common/jobs/registry.py"
HANDLER = "libs/common/src/san_common/worker/handler.py"
ADMIN_REPO = "services/api/src/san_api/admin/repository.py"
QUOTAS = "libs/common/src/san_common/quotas.py"
DIRECT = "libs/common/src/san_common/broker/direct.py"
REGISTRATION = "libs/common/src/san_common/jobs/registration.py"
PUBLISH_AFTER_COMMIT = "tests/faults/test_publish_after_commit.py"
GITHUB_QUOTA = (
    "tests/github/test_quota.py::test_commits_past_the_announced_limit_wait_for_the_reset"
)
AI_QUOTA = (
    "tests/faults/test_upstream_quota.py"
    "::test_two_workers_share_the_ai_quota_without_429s_or_spent_tries[on]"
)
USAGE_BUDGETS = "libs/common/src/san_common/usage/budgets.py"
RUNNABLE = "services/recovery/src/san_recovery/runnable.py"
RUNNABLE_TESTS = "tests/recovery/test_runnable.py"
DEPTHS = "libs/common/src/san_common/broker/depths.py"
JOBS_ENDPOINTS = "services/api/src/san_api/jobs/endpoints.py"
BUSY_POOL = (
    "tests/api/test_edge.py::test_a_request_that_finds_every_pooled_connection_busy_answers_503"
    "_in_time[limits-off]"
)
WAITING_FAIR = (
    "tests/faults/test_waiting_visible.py"
    "::test_jobs_held_back_by_fair_share_say_so_and_still_count_as_runnable"
)
WAITING_VISIBLE = (
    "tests/faults/test_waiting_visible.py"
    "::test_a_job_waiting_for_the_quota_says_so_and_is_not_runnable"
)
USAGE_BUDGET_TESTS = "tests/usage/test_budgets.py"
JOB_TYPE_E2E = (
    "tests/jobtype/test_word_count.py::test_a_job_type_added_as_the_docs_say_runs_end_to_end"
)
STORE_OUTAGE = "tests/faults/test_store_outage.py"
HELD_THROUGH_OUTAGE = (
    f"{STORE_OUTAGE}"
    "::test_results_held_through_a_postgres_stop_are_stored_without_asking_the_ai_again"
)
PARTITION = tuple(
    "tests/api/test_edge.py::test_a_database_that_stops_answering_costs_503s_in_time_and_the"
    f"_api_resumes[{limits}]"
    for limits in ("limits-off", "limits-on")
)


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    edits: tuple[Edit, ...]
    catchers: tuple[str, ...]  # pytest node ids


MUTATIONS = (
    Mutation(
        "fencing",
        "fencing removed from the owned update (`_HELD` no longer matches the try)",
        (
            Edit(
                LIFECYCLE,
                "_HELD = \"j.job_id = $1 AND j.status = 'PROCESSING' AND j.tries = $2\"",
                "_HELD = \"j.job_id = $1 AND j.status = 'PROCESSING' AND $2::int IS NOT NULL\"",
            ),
            Edit(LIFECYCLE, "      AND j.tries = mine.try_no\n", ""),
            Edit(
                LIFECYCLE,
                "AND j.status = 'PROCESSING' AND j.tries = mine.try_no\n",
                "AND j.status = 'PROCESSING'\n",
            ),
        ),
        (
            f"{LEASES}::test_a_taken_over_try_changes_nothing_with_any_of_its_writes",
            f"{LEASES}::test_a_late_result_is_rolled_back_and_the_new_try_keeps_the_job",
        ),
    ),
    Mutation(
        "complete-result-ignored",
        "`complete()`'s result ignored (a fenced-out try's store is committed)",
        (
            Edit(
                STORE,
                "if not await jobs.complete(session, claim.job.job_id, claim.try_no):\n"
                "                        raise _LeaseLost\n",
                "await jobs.complete(session, claim.job.job_id, claim.try_no)\n",
            ),
            Edit(
                STORE,
                "    if len(done) < count:\n        raise _LeaseLost(done)\n",
                "",
            ),
        ),
        (f"{LEASES}::test_a_late_result_is_rolled_back_and_the_new_try_keeps_the_job",),
    ),
    Mutation(
        "takeover-removed",
        "expired-lease takeover removed from the claim",
        (
            Edit(
                LIFECYCLE,
                "WHEN 'PROCESSING' THEN j.lease_expires_at < now() OR",
                "WHEN 'PROCESSING' THEN j.lease_expires_at < now() - interval '100 years' OR",
            ),
        ),
        (f"{LEASES}::test_a_taken_over_try_changes_nothing_with_any_of_its_writes",),
    ),
    Mutation(
        "rescuer-removed",
        "the lease rescuer finds no expired lease",
        (
            Edit(
                LIFECYCLE,
                "WHERE status = 'PROCESSING' AND lease_expires_at < now()\n",
                "WHERE status = 'PROCESSING' AND lease_expires_at < now() - interval '100 years'\n",
            ),
        ),
        (f"{LEASES}::test_the_rescuer_makes_expired_jobs_claimable_under_the_same_id",),
    ),
    Mutation(
        "heartbeat-noop",
        "heartbeat made a no-op (the lease is never renewed)",
        (
            Edit(
                LEASES_KEEPER,
                "*(self._store.extend(c, self._lease) for c in claims)",
                "*(asyncio.sleep(0, True) for c in claims)",
            ),
        ),
        (f"{LEASES}::test_the_heartbeat_keeps_a_long_job_s_lease",),
    ),
    Mutation(
        "completed-claimable",
        "a COMPLETED job claimable again (duplicate delivered after the first completed)",
        (
            Edit(
                LIFECYCLE,
                "        ELSE false\n",
                "        WHEN 'COMPLETED' THEN true\n        ELSE false\n",
            ),
        ),
        (f"{LEASES}::test_a_duplicate_delivered_after_completion_is_skipped",),
    ),
    Mutation(
        "group-lease-unchecked",
        "a completion batch commits although one of its tries was taken over",
        (
            Edit(
                STORE,
                "    if len(done) < count:\n        raise _LeaseLost(done)\n",
                "",
            ),
        ),
        (f"{GROUP}::test_a_batch_with_a_taken_over_try_completes_the_others_and_not_that_one",),
    ),
    Mutation(
        "driver-write-outside-transaction",
        "the writes a completion runs on the driver commit on their own (outside the"
        " completion's transaction: a taken-over try's write commits)",
        (
            Edit(
                STORE,
                "async with driver_connection(self._engine) as connection,"
                " connection.transaction():",
                "async with driver_connection(self._engine) as connection:",
            ),
        ),
        (
            f"{GROUP}::test_a_batch_with_a_taken_over_try_completes_the_others_and_not_that_one"
            "[driver]",
        ),
    ),
    Mutation(
        "driver-skips-conversions",
        "a write whose parameters SQLAlchemy converts (JSONB) runs on the driver unconverted",
        (
            Edit(
                STORE,
                "bind.type.dialect_impl(dialect).bind_processor(dialect) is None",
                "bind is not None",
            ),
        ),
        (f"{GROUP}::test_a_write_whose_parameters_sqlalchemy_converts_goes_through_sqlalchemy",),
    ),
    Mutation(
        "group-no-fallback",
        "a completion batch that cannot commit fails every job in it",
        (
            Edit(
                STORE,
                "            rest = [i for k, i in enumerate(batch) if k != failed.index]\n",
                "            return [failed.__cause__ or failed] * len(batch)\n"
                "            rest = [i for k, i in enumerate(batch) if k != failed.index]\n",
            ),
        ),
        (f"{GROUP}::test_a_batch_with_a_failing_store_fails_only_that_job",),
    ),
    Mutation(
        "shared-write-failure-fails-the-batch",
        "a write the jobs of a completion batch share fails every job in it, not its own",
        (
            Edit(
                STORE,
                "                # A shared write raised: each job again on its own finds whose"
                " it was.\n                return [await _outcome(self._finish_one(item)) for item"
                " in batch]\n",
                "                return [failed.__cause__ or failed] * len(batch)\n",
            ),
        ),
        (f"{GROUP}::test_a_shared_write_that_fails_fails_only_the_job_it_was_for",),
    ),
    Mutation(
        "abandoned-claim-kept",
        "a claim whose caller was cancelled mid-statement is kept (nobody runs the job)",
        (Edit(STORE, "abandoned=self._release_abandoned", "abandoned=None"),),
        (f"{GROUP}::test_a_claim_whose_caller_is_cancelled_mid_statement_is_released",),
    ),
    Mutation(
        "relay-no-confirms",
        "relay channel without publisher confirms",
        (
            Edit(
                RELAY,
                "connection.channel(publisher_confirms=True, on_return_raises=True)",
                "connection.channel(publisher_confirms=False)",
            ),
        ),
        (f"{GUARDS}::test_the_running_relay_never_marks_a_message_the_broker_did_not_confirm",),
    ),
    Mutation(
        "index-pending-only",
        "the partial unique index narrowed to PENDING only (migration, model, registration)",
        (
            Edit(
                "libs/common/src/san_common/db/migrations/versions/0001_initial.py",
                "WHERE status IN ('PENDING', 'PROCESSING')\"",
                "WHERE status IN ('PENDING')\"",
            ),
            Edit(
                "libs/common/src/san_common/models/jobs.py",
                '_ACTIVE = ", ".join(f"\'{s.value}\'" for s in ACTIVE_STATUSES)',
                "_ACTIVE = \"'PENDING'\"",
            ),
            Edit(
                "libs/common/src/san_common/jobs/registration.py",
                "ON CONFLICT (target_id, job_type) WHERE status IN ('PENDING', 'PROCESSING')",
                "ON CONFLICT (target_id, job_type) WHERE status IN ('PENDING')",
            ),
        ),
        (
            "tests/test_migrations.py::test_upgrade_downgrade_round_trip_and_models_match",
            f"{GUARDS}::test_a_processing_job_still_blocks_a_second_active_job_for_its_target",
        ),
    ),
    Mutation(
        "envelope-version-unchecked",
        "envelope-version check removed",
        (
            Edit(
                EXECUTOR,
                "        if envelope.version != ENVELOPE_VERSION:\n",
                "        if False:\n",
            ),
        ),
        (
            f"{LEASES}::test_an_envelope_of_an_unknown_version_is_dead_lettered_and_not_run",
            "tests/unit/test_executor.py::test_messages_it_cannot_run_are_dead_lettered_with_their_reason",
        ),
    ),
    Mutation(
        "no-delivery-limit",
        "delivery limit removed from the job queues",
        (Edit(TOPOLOGY, '        "x-delivery-limit": DELIVERY_LIMIT,\n', ""),),
        (f"{GUARDS}::test_a_message_requeued_past_the_delivery_limit_is_dead_lettered",),
    ),
    Mutation(
        "relay-rounds-never-overlap",
        "the relay's follower rounds never join the leader under a backlog",
        (Edit(RELAY, "                self._backlog.set()", "                pass"),),
        (
            "tests/relay/test_relay.py::"
            "test_under_a_backlog_rounds_overlap_and_publish_each_row_once[2]",
        ),
    ),
    Mutation(
        "relay-ignores-next-due",
        "the relay sleeps to the poll, not to the time its claim said a row falls due",
        (
            Edit(
                RELAY,
                "        if self._next_due is not None:",
                "        if False and self._next_due is not None:",
            ),
        ),
        (
            "tests/relay/test_relay.py::"
            "test_a_row_scheduled_for_later_is_published_when_due_not_at_the_poll",
        ),
    ),
    Mutation(
        "relay-publishes-early",
        "the relay's claim takes rows that are not due yet",
        (
            Edit(
                OUTBOX_CLAIM,
                "        WHERE o.published_at IS NULL AND o.available_at <= now()\n",
                "        WHERE o.published_at IS NULL\n",
            ),
        ),
        (
            "tests/relay/test_relay.py::"
            "test_a_row_scheduled_for_later_is_published_when_due_not_at_the_poll",
        ),
    ),
    Mutation(
        "edge-no-head-limit",
        "the API's request-head limit removed (httptools buffers any header)",
        (
            Edit(COMPAT, 'raise ValueError("request head too large")', "pass"),
            Edit(COMPAT, 'self.send_400_response("Request headers too large.")', "pass"),
        ),
        (
            "tests/api/test_edge.py::"
            "test_a_request_head_over_the_header_limit_is_refused_and_a_body_is_not_its_head",
        ),
    ),
    Mutation(
        "deadlock-spends-a-try",
        "a completion that lost a deadlock is not run again (its error counts against the job)",
        (
            Edit(
                STORE,
                "if attempt == CONTENTION_ATTEMPTS or not is_contention(exc):",
                "if True:",
            ),
        ),
        (f"{GROUP}::test_a_completion_that_loses_a_deadlock_to_another_worker_is_run_again",),
    ),
    Mutation(
        "batch-deadlock-fails-the-batch",
        "a completion batch that lost a deadlock in its own statement fails every job in it",
        (
            Edit(
                STORE,
                "            if not is_contention(exc):\n                raise\n",
                "            raise\n",
            ),
        ),
        (f"{GROUP}::test_a_batch_that_loses_a_deadlock_in_its_completion_runs_each_job_again",),
    ),
    Mutation(
        "relay-claim-sorts-on",
        "the relay's claim leaves the plan to the statistics (a stale count: every round "
        "reads and sorts the whole backlog)",
        (Edit(OUTBOX_CLAIM, "        SET enable_sort = off\n", ""),),
        (
            "tests/relay/test_claim_plan.py::"
            "test_a_claim_reads_its_batch_not_the_backlog_under_the_statistics_of_an_empty_outbox",
        ),
    ),
    Mutation(
        "worker-claim-through-status",
        "the worker's claim tests the status with ORs an index on status can serve (a "
        "quiet table's statistics: every claim reads the whole PENDING backlog)",
        (
            Edit(
                LIFECYCLE,
                """      AND CASE j.status
        WHEN 'PENDING' THEN j.next_attempt_at IS NULL OR j.next_attempt_at <= now()
        WHEN 'PROCESSING' THEN j.lease_expires_at < now() OR ($4 AND j.worker_id = $2)
        ELSE false
      END
""",
                """      AND (
        (j.status = 'PENDING' AND (j.next_attempt_at IS NULL OR j.next_attempt_at <= now()))
        OR (j.status = 'PROCESSING' AND j.lease_expires_at < now())
        OR (j.status = 'PROCESSING' AND $4 AND j.worker_id = $2)
      )
""",
            ),
        ),
        (
            "tests/worker/test_claim_plan.py::"
            "test_a_claim_reads_its_batch_not_the_backlog_under_the_statistics_of_a_quiet_table",
        ),
    ),
    Mutation(
        "acks-together-multiple",
        "a job's ack uses `multiple` (it also settles the deliveries below it that are "
        "still running: lost if the worker dies)",
        (
            Edit(
                CONSUMER,
                "        await self._message.ack()\n",
                "        await self._message.ack(multiple=True)\n",
            ),
        ),
        (
            "tests/worker/test_acks.py::"
            "test_acks_asked_together_each_settle_their_own_delivery_only",
        ),
    ),
    Mutation(
        "claimed-job-unconfigured",
        "the claimed job is built before the mappers are configured (a fresh worker's first "
        "claims fail, read as a database outage, and are requeued)",
        (Edit(COMPAT, "        configure_mappers()\n", ""),),
        (
            "tests/worker/test_claimed_job.py::"
            "test_a_fresh_process_reads_the_job_of_its_first_claim",
        ),
    ),
    Mutation(
        "claim-errors-read-as-outages",
        "every exception out of the claim is read as a database outage (a bug in it is "
        "logged as 'database unavailable', without its traceback, and passes for one)",
        (
            Edit(
                EXECUTOR,
                "            except Exception as exc:\n"
                "                if _is_database_state(exc):\n"
                "                    raise _Outage(exc) from exc\n"
                "                raise  # a bug",
                "            except Exception as exc:\n"
                "                if True:\n"
                "                    raise _Outage(exc) from exc\n"
                "                raise  # a bug",
            ),
        ),
        (
            f"{CLAIM_ERRORS}::test_an_error_of_the_claim_that_is_no_outage_is_logged_as_a_bug",
            "tests/unit/test_executor.py::"
            "test_a_bug_in_the_claim_is_logged_as_a_bug_not_as_an_outage",
        ),
    ),
    Mutation(
        "claim-deadlock-read-as-bug",
        "a claim that lost a deadlock is read as a bug (an error with a traceback for the "
        "database's ordinary contention)",
        (
            Edit(
                EXECUTOR,
                "    return is_connection_loss(exc) or is_contention(exc)\n",
                "    return is_connection_loss(exc)\n",
            ),
        ),
        (f"{CLAIM_ERRORS}::test_a_claim_that_loses_a_deadlock_is_requeued_as_contention",),
    ),
    Mutation(
        "bug-requeued-without-pause",
        "a delivery that hit an unexpected error is requeued at once (a bug that repeats "
        "spins until the delivery limit)",
        (
            Edit(
                EXECUTOR,
                'return await self._requeue_after(context, pause, "unexpected worker error")',
                'return await self._requeue_after(context, 0.0, "unexpected worker error")',
            ),
        ),
        ("tests/unit/test_executor.py::test_a_bug_that_repeats_does_not_spin_its_delivery",),
    ),
    Mutation(
        "dead-letter-listing-consumes",
        "listing dead letters takes them off the queue instead of giving each back",
        (
            Edit(
                ADMIN_BROKER,
                "                            await message.nack(requeue=True)\n",
                "                            await message.ack()\n",
            ),
        ),
        (
            "tests/admin/test_dead_letters.py::"
            "test_every_dead_letter_says_why_listing_changes_nothing_and_redrive_reports_each",
        ),
    ),
    Mutation(
        "redrive-unchecked",
        "re-drive publishes a dead letter that could only be dead-lettered again (no check)",
        (
            Edit(
                ADMIN_BROKER,
                "why = not_redrivable(message, deployment_id, known)",
                "why = None",
            ),
        ),
        (
            "tests/admin/test_dead_letters.py::"
            "test_every_dead_letter_says_why_listing_changes_nothing_and_redrive_reports_each",
        ),
    ),
    Mutation(
        "foreign-or-unknown-acked",
        "a message of another deployment, or of a job this deployment does not know, is "
        "acked as skipped instead of dead-lettered",
        (
            Edit(
                EXECUTOR,
                "        if sender is not None and self.deployment_id is not None and sender != "
                "self.deployment_id:\n",
                "        if sender is not None and self.deployment_id is not None and sender != "
                "self.deployment_id:\n            await self._ack(delivery)\n"
                "            return Outcome.SKIPPED\n",
            ),
            Edit(
                EXECUTOR,
                "            if got is None:\n",
                "            if got is None:\n                await self._ack(delivery)\n"
                "                return Outcome.SKIPPED\n",
            ),
        ),
        (
            "tests/unit/test_executor.py::test_messages_of_another_deployment_or_an_unknown_job"
            "_are_dead_lettered_with_one_warning",
            "tests/worker/test_deployments.py::"
            "test_foreign_and_unknown_job_messages_are_dead_lettered_with_their_reason",
            "tests/faults/test_foreign_deployment.py::"
            "test_a_foreign_consumer_and_foreign_messages_strand_nothing_and_leave_a_trace",
        ),
    ),
    Mutation(
        "drain-starts-held-deliveries",
        "a delivery still waiting for a slot when the worker drains is started in the drain "
        "window instead of going back to its queue",
        (Edit(CONSUMER, "            if self._draining:\n", "            if False:\n"),),
        (
            "tests/worker/test_drain.py::"
            "test_a_delivery_waiting_for_a_slot_when_the_drain_begins_is_requeued_not_run",
        ),
    ),
    Mutation(
        "job-events-every-update",
        "the job-event log's statement trigger logs every updated row, status changed or not "
        "(a heartbeat floods every stream with events)",
        (Edit(JOB_EVENTS, '"WHERE n.status IS DISTINCT FROM o.status",', '"",'),),
        (
            "tests/api/test_job_event_log.py::"
            "test_each_row_a_statement_changes_gets_its_event_and_its_notify",
        ),
    ),
    Mutation(
        "registration-pools-a-dead-connection",
        "a statement on the driver (`register_job`, the claim) lets a connection that died "
        "under it go back to the pool (SQLAlchemy never saw the error: the next statement "
        "fails on it)",
        (
            Edit(
                ENGINE,
                "                await connection.invalidate(exc)\n",
                "                pass\n",
            ),
        ),
        (
            "tests/faults/test_registration.py::"
            "test_a_connection_lost_mid_registration_is_not_pooled_again",
        ),
    ),
    Mutation(
        "driver-statement-keeps-silent-pool",
        "a claim on the driver that timed out on a silent server replaces its own connection "
        "only: every other pooled connection costs the next claims one timeout each",
        (
            Edit(
                ENGINE,
                "                _SilentServer.of(engine.sync_engine).heard()\n",
                "                pass\n",
            ),
        ),
        (f"{TIMEOUTS}::test_a_claim_that_meets_a_silent_server_replaces_the_pool_too",),
    ),
    Mutation(
        "relay-rounds-unspaced",
        "the relay starts a round for every notification, however close behind the last",
        (Edit(RELAY, "                if rest > 0:\n", "                if False:\n"),),
        ("tests/relay/test_relay.py::test_messages_that_keep_coming_share_rounds_spaced_apart",),
    ),
    Mutation(
        "similar-cards-sorts-on",
        "the similar-cards search keeps sorts on (the planner's exact scan, ~200 ms at 100k)",
        (Edit(NEAREST, "        SET enable_sort = off\n", ""),),
        (
            "tests/api/test_similar_cards_plan.py::"
            "test_the_approximate_search_walks_the_hnsw_index_and_the_exact_one_does_not",
        ),
    ),
    Mutation(
        "token-cache-past-expiry",
        "the verified-token cache keeps a token for its TTL even past the token's expiry",
        (
            Edit(
                TOKEN_CACHE,
                "(claims, min(expires_at, self._clock() + self._ttl))",
                "(claims, self._clock() + self._ttl)",
            ),
        ),
        (
            "tests/api/test_token_cache.py::"
            "test_a_token_is_kept_until_its_expiry_or_the_ttl_whichever_comes_first",
            "tests/api/test_token_cache.py::test_a_cached_token_is_refused_once_it_expires",
        ),
    ),
    Mutation(
        "api-connection-commits-a-failure",
        "the request's transaction commits when it failed half-way instead of rolling back",
        (
            Edit(
                API_DEPS,
                "    except BaseException:\n        await rollback()\n",
                "    except BaseException:\n        await commit()\n",
            ),
        ),
        (
            "tests/api/test_commit_before_reply.py::"
            "test_an_error_after_a_write_on_the_connection_takes_the_write_back",
        ),
    ),
    Mutation(
        "api-pool-kept-after-loss",
        "a connection lost under a request's transaction is replaced alone, its pool's others kept",
        (Edit(API_DEPS, "        await pool.expire_connections()\n", "        pass\n"),),
        tuple(
            f"tests/api/test_edge.py::test_{kind}_database_connections_cost_one_503_not_one"
            f"_per_pooled_connection[{limits}]"
            for kind in ("terminated", "stranded")
            for limits in ("limits-off", "limits-on")
        ),
    ),
    Mutation(
        "api-rate-limiter-keeps-lost-pool",
        "the rate limiter takes its connection from the pool bare: a lost one is not noticed",
        (
            Edit(
                API_LIMITS,
                "pooled_connection(request)",
                "request.app.state.connections.acquire()",
            ),
        ),
        (
            "tests/api/test_edge.py::test_terminated_database_connections_cost_one_503_not_one"
            "_per_pooled_connection[limits-on]",
            # the same without the race: caught every time
            "tests/api/test_edge.py::test_stranded_database_connections_cost_one_503_not_one"
            "_per_pooled_connection[limits-on]",
        ),
    ),
    Mutation(
        "api-pool-waits-forever",
        "the API's asyncpg pool sets no command timeout: a partition hangs POST /scraps",
        (Edit(API_APP, "command_timeout=timeout,\n", "command_timeout=None,\n"),),
        PARTITION,
    ),
    Mutation(
        "api-pool-wait-unbounded",
        "a request waits for a free connection of the API's asyncpg pool for as long as it takes",
        (
            Edit(
                API_DEPS,
                "        async with asyncio.timeout(timeout):\n",
                "        async with asyncio.timeout(None):\n",
            ),
        ),
        (BUSY_POOL,),
    ),
    Mutation(
        "api-pool-wait-unnamed",
        "no free pooled connection in time is answered 500, not 503 DATABASE_UNAVAILABLE",
        (
            Edit(
                API_ERRORS,
                "        if isinstance(current, NoConnectionInTime) or (\n",
                "        if (\n",
            ),
        ),
        (BUSY_POOL,),
    ),
    Mutation(
        "api-engine-waits-forever",
        "SQLAlchemy's engine sets no command timeout: a partition hangs the session endpoints",
        (
            Edit(
                ENGINE,
                "connect_args.update(timeout=timeout_seconds, command_timeout=timeout_seconds)",
                "connect_args.update(timeout=timeout_seconds)",
            ),
        ),
        PARTITION,
    ),
    Mutation(
        "api-database-timeout-unnamed",
        "a statement PostgreSQL did not answer in time is reported as any other outage",
        (
            Edit(
                API_ERRORS,
                "isinstance(current, TimeoutError) and _raised_in_db_client(current)\n",
                "isinstance(current, TimeoutError) and not _raised_in_db_client(current)\n",
            ),
        ),
        PARTITION,
    ),
    Mutation(
        "api-closed-connection-not-an-outage",
        "asyncpg's 'connection is closed' is not seen as a lost database (a 500, not a 503)",
        (
            Edit(
                API_ERRORS,
                'isinstance(current, asyncpg.InterfaceError) and "connection is closed" in str',
                'isinstance(current, asyncpg.InterfaceError) and "never" in str',
            ),
        ),
        ("tests/api/test_edge.py::test_a_closed_asyncpg_connection_reads_as_a_lost_database",),
    ),
    Mutation(
        "worker-waits-forever",
        "the workers' engine sets no timeout: a partitioned worker holds its deliveries",
        (Edit(WORKER_SETTINGS, "            timeout_seconds=timeout,\n", ""),),
        (
            f"{PARTITIONS}::test_a_worker_cut_off_from_postgres_gives_its_deliveries_back_to"
            "_another",
        ),
    ),
    Mutation(
        "relay-waits-forever",
        "the relay's engine sets no timeout: a stranded connection stops the relay",
        (Edit(RELAY_SETTINGS, "            timeout_seconds=timeout,\n", ""),),
        (f"{PARTITIONS}::test_a_relay_whose_connections_go_silent_connects_again_and_publishes",),
    ),
    Mutation(
        "relay-keeps-deaf-listener",
        "a round that timed out leaves the listener as it is (open, silent for good)",
        (Edit(RELAY, "self._forget_listener()\n", "pass\n"),),
        (f"{PARTITIONS}::test_a_relay_whose_connections_go_silent_connects_again_and_publishes",),
    ),
    Mutation(
        "silent-pool-kept",
        "a timed-out statement discards its own connection only, not the silent pool",
        (Edit(ENGINE, "        context.invalidate_pool_on_disconnect = True\n", ""),),
        (
            *(
                f"{TIMEOUTS}::test_after_one_silent_statement_the_pool_is_replaced_not_timed_out"
                f"_one_by_one[{engine}]"
                for engine in ("worker", "relay")
            ),
            f"{TIMEOUTS}::test_a_completion_batch_that_meets_a_silent_server_is_an_outage_and"
            "_replaces_the_pool",
        ),
    ),
    Mutation(
        "abandoned-transaction-kept",
        "the server keeps a transaction its silent client left open (and its locks)",
        (
            Edit(
                ENGINE,
                '        server_settings["idle_in_transaction_session_timeout"] = (',
                '        server_settings["application_name"] = (',
            ),
        ),
        tuple(
            f"{TIMEOUTS}::test_a_transaction_its_client_stopped_driving_is_ended_by_the_server"
            f"[{engine}]"
            for engine in ("worker", "relay")
        ),
    ),
    Mutation(
        "github-lock-wait-timed-out",
        "the GitHub worker's per-user lock wait is cut by the engine's statement timeout",
        (
            Edit(
                GITHUB_LOCKS,
                "await driver.execute(_LOCK, str(user_id), timeout=_LOCK_WAIT_SECONDS)",
                "await driver.execute(_LOCK, str(user_id))",
            ),
        ),
        (
            "tests/github/test_user_locks.py::test_a_wait_longer_than_the_engines_statement"
            "_timeout_is_no_outage",
        ),
    ),
    Mutation(
        "recovery-waits-unbounded",
        "the recovery service waits on a silent PostgreSQL connection until TCP gives up",
        (Edit(RECOVERY_SETTINGS, "            timeout_seconds=timeout,\n", ""),),
        (
            f"{PARTITIONS}::test_a_recovery_service_whose_connections_go_silent_runs_the_next_sweeps",
        ),
    ),
    Mutation(
        "recovery-abandoned-transaction-kept",
        "the server keeps a transaction the silent recovery service left open (and its locks)",
        (Edit(RECOVERY_SETTINGS, "            idle_transaction_seconds=timeout,\n", ""),),
        (
            f"{TIMEOUTS}::test_a_transaction_its_client_stopped_driving_is_ended_by_the_server[recovery]",
        ),
    ),
    Mutation(
        "job-events-connect-unbounded",
        "the API's job-events listener connects with asyncpg's default (60 s) wait",
        (
            Edit(
                EVENT_HUB,
                "self._url, timeout=self._timeout, command_timeout=self._timeout",
                "self._url, command_timeout=self._timeout",
            ),
        ),
        (
            "tests/api/test_job_events.py::test_a_silent_database_fails_a_subscription_in_time"
            "_and_listening_resumes",
        ),
    ),
    Mutation(
        "sweep-request-never-taken-again",
        "a 'run now' whose recovery process died stays started and is never run",
        (
            Edit(
                RECOVERY_REPO,
                "                SweepRequest.heartbeat_at < func.now() - stale_after,\n",
                "",
            ),
        ),
        (
            f"{REQUESTS}::test_a_request_whose_process_stopped_beating_is_run_again",
            "tests/faults/test_recovery_sigkill.py::test_a_run_now_whose_recovery_process_is_killed"
            "_is_run_by_the_next",
        ),
    ),
    Mutation(
        "sweep-request-unfenced",
        "a stalled recovery process finishes a request another process has taken since",
        (Edit(RECOVERY_REPO, "            SweepRequest.attempts == attempt,\n", ""),),
        (f"{REQUESTS}::test_the_earlier_taker_is_fenced_out",),
    ),
    Mutation(
        "sweep-request-no-heartbeat",
        "the process running a 'run now' never beats: a long run is taken again meanwhile",
        (
            Edit(
                RECOVERY_RUNNER,
                "    while True:\n        await asyncio.sleep(every)\n",
                "    while False:\n        await asyncio.sleep(every)\n",
            ),
        ),
        (f"{REQUESTS}::test_a_run_longer_than_the_stale_bound_keeps_its_request",),
    ),
    Mutation(
        "job-events-listener-unprobed",
        "the API's LISTEN connection is never probed: once stranded, no notification arrives",
        (
            Edit(
                EVENT_HUB,
                "self._prober = asyncio.get_running_loop().create_task(self._probe())",
                "self._prober = None",
            ),
        ),
        (
            "tests/api/test_job_events.py::test_a_listener_that_goes_silent_is_replaced_and"
            "_notifications_flow_again",
        ),
    ),
    Mutation(
        "worker-consumes-without-database",
        "a worker whose database is unreachable keeps consuming (no breaker)",
        (Edit(CONSUMER, "if is_connection_loss(exc):\n", "if False:\n"),),
        (
            "tests/worker/test_pause.py::test_a_worker_whose_database_is_unreachable_stops"
            "_consuming_until_it_answers",
        ),
    ),
    Mutation(
        "stranded-republish-removed",
        "the stranded-message check re-publishes nothing (a purged job waits for the ghost sweep)",
        (
            Edit(
                STRANDED,
                "jobs = await repository.mark_republished(session, confirmed, NOTE)",
                "jobs = await repository.mark_republished(session, {}, NOTE)",
            ),
        ),
        (
            f"{STRANDED_TESTS}::test_purged_queues_are_healed_without_repeating_a_call",
            f"{MAINTENANCE_TESTS}::test_purged_messages_are_republished_once_on_the_second_sighting",
        ),
    ),
    Mutation(
        "stranded-first-sighting",
        "the stranded check re-publishes what it suspects at once (deliveries waiting in a "
        "worker's buffer too)",
        (
            Edit(
                STRANDED,
                "confirmed = {j: at for j, at in suspects.items() if before.get(j) == at}",
                "confirmed = dict(suspects)",
            ),
        ),
        (f"{MAINTENANCE_TESTS}::test_purged_messages_are_republished_once_on_the_second_sighting",),
    ),
    Mutation(
        "outage-warned-every-time",
        "every failed call of an outage logs its own WARNING",
        (Edit(OUTAGES, "        if self._since is None:\n", "        if True:\n"),),
        (
            "tests/faults/test_outage_logs.py::test_an_outage_is_one_warning_and_one_info_per_service",
        ),
    ),
    Mutation(
        "superseded-retried",
        "an operator's retry runs a FAILED job that a newer job of its target superseded",
        (Edit(LIFECYCLE, "      AND NOT {_NEWER}\n", ""),),
        (
            f"{SUPERSEDED_TESTS}::test_bulk_retry_skips_what_the_failed_sweep_superseded",
            f"{SUPERSEDED_TESTS}::test_an_operator_retry_and_the_failed_sweep_at_once_make_one_job",
        ),
    ),
    Mutation(
        "undeclared-transition-allowed",
        "the database lets an UPDATE make a status change the lifecycle does not declare",
        (
            Edit(
                TRANSITIONS_MIGRATION,
                "    ) c\n    WHERE NOT EXISTS (",
                "    ) c\n    WHERE false AND NOT EXISTS (",
            ),
        ),
        (
            f"{LIFECYCLE_TESTS}::"
            "test_an_undeclared_transition_written_as_raw_sql_is_refused[PENDING-COMPLETED]",
            f"{LIFECYCLE_TESTS}::test_a_batch_with_one_undeclared_change_is_refused_whole",
        ),
    ),
    Mutation(
        "transition-check-quadratic",
        "the lifecycle's check joins a statement's transition tables in a nested loop",
        (
            Edit(
                TRANSITIONS_MIGRATION,
                "        OFFSET 0  -- planned without the LIMIT below: "
                "a hash join, not a nested loop\n",
                "",
            ),
        ),
        (f"{LIFECYCLE_TESTS}::test_the_check_of_a_large_batch_stays_linear",),
    ),
    Mutation(
        "try-left-open",
        "recovery gives up on a ghost and leaves its running try open",
        (
            Edit(
                LIFECYCLE,
                "    WHERE t.job_id = failed.job_id AND t.outcome IS NULL\n",
                "    WHERE t.job_id = failed.job_id AND false\n",
            ),
        ),
        (
            f"{LIFECYCLE_TESTS}::test_every_transition_moves_the_job_its_try_its_event_and_its"
            "_mirror[PROCESSING-give_up-FAILED]",
        ),
    ),
    # -- security (issue 36) ------------------------------------------------------------------
    Mutation(
        "mirror-carries-the-cause-chain",
        "a failed job's target row (read by its owner) gets the full cause chain again",
        (
            Edit(
                LIFECYCLE,
                "await _mirror_error(session, job_type, target_id, _FAILED, summary)",
                "await _mirror_error(session, job_type, target_id, _FAILED, message)",
            ),
        ),
        (
            "tests/api/test_error_summaries.py::test_no_user_facing_answer_shows_the_upstream"
            "_text_and_the_operator_sees_it_redacted",
        ),
    ),
    Mutation(
        "event-streams-uncapped-per-user",
        "one user may open as many event streams as the process allows",
        (Edit(STREAM_SLOTS, "if self._by_user[user_id] >= self.per_user:", "if False:"),),
        (
            "tests/api/test_job_event_limits.py::test_one_user_flooding_streams_is_capped_and"
            "_others_and_probes_are_served",
        ),
    ),
    Mutation(
        "event-streams-live-forever",
        "a stream of an unfinished job is never ended by the server",
        (Edit(JOB_EVENTS_ENDPOINT, "            if wait <= 0:\n", "            if False:\n"),),
        (
            "tests/api/test_job_event_limits.py::test_a_stream_past_its_lifetime_is_closed_and"
            "_resuming_loses_nothing",
        ),
    ),
    Mutation(
        "probes-not-exempt-from-the-cap",
        "beyond the connection cap, the health and readiness probes are refused too",
        (Edit(COMPAT, "return path not in exempt_paths", "return True"),),
        (
            "tests/api/test_edge.py::test_connections_beyond_the_cap_are_refused_with_503_but"
            "_the_probes_are_answered",
        ),
    ),
    Mutation(
        "console-csrf-off",
        "the console accepts unsafe requests with its cookie from any origin",
        (Edit(CSRF, "return not same_origin(scope, headers)", "return False"),),
        (
            "tests/admin/test_csrf.py::test_a_cross_origin_form_post_to_every_unsafe_admin_route"
            "_is_403_and_changes_nothing",
        ),
    ),
    Mutation(
        "edge-streamed-body-unbounded",
        "a chunked body with no Content-Length is read past REQUEST_MAX_BYTES",
        (
            Edit(
                API_EDGE,
                "                raise _TooLarge(self._max_bytes)\n",
                "                pass\n",
            ),
        ),
        ("tests/api/test_bad_input.py::test_chunked_request_body_over_the_limit_is_413",),
    ),
    Mutation(
        "edge-body-without-deadline",
        "a body that drips in is waited for however long it takes",
        (Edit(API_EDGE, "async with asyncio.timeout_at(self._deadline):", "if True:"),),
        (
            "tests/api/test_edge.py::test_hostile_headers_and_bodies_are_cut_off_and_memory"
            "_stays_bounded",
        ),
    ),
    Mutation(
        "edge-answers-without-security-headers",
        "answers leave without nosniff, framing, cache and CSP headers",
        (
            Edit(
                API_EDGE,
                "headers += [(k, v) for k, v in _ALWAYS if k not in present]",
                "headers += []",
            ),
        ),
        ("tests/api/test_edge.py::test_every_answer_has_security_headers_and_no_server_banner",),
    ),
    Mutation(
        "edge-unhandled-error-re-raised",
        "an unexpected exception reaches uvicorn, which drops the keep-alive connection",
        (
            Edit(
                API_EDGE,
                "            if exchange.started:\n                raise  # a half-sent",
                "            if True:\n                raise  # a half-sent",
            ),
        ),
        ("tests/api/test_edge.py::test_a_500_keeps_the_connection_and_says_nothing_inside",),
    ),
    Mutation(
        "github-routes-unlimited",
        "PUT /me/github calls GitHub on every request, however many",
        (Edit(GITHUB_ENDPOINTS, '    dependencies=upstream_limit("github-link"),\n', ""),),
        (
            "tests/github/test_upstream_limits.py::test_sixty_token_links_in_ten_seconds_reach"
            "_github_at_most_the_burst",
        ),
    ),
    Mutation(
        "token-time-claims-untyped",
        "a signed token's exp/nbf/iat are not type-checked (pyjwt takes digit strings)",
        (
            Edit(
                TOKENS,
                "                if not _is_number(value):\n",
                "                if False:\n",
            ),
        ),
        (
            "tests/api/test_auth.py::test_a_signed_token_with_a_mistyped_time_claim_is_401_with"
            "_the_reason",
        ),
    ),
    Mutation(
        "runtime-type-unmirrored",
        "only the built-in job types' mirrors move (a type registered at start-up never does)",
        (
            Edit(
                REGISTRY,
                "return {t: s.mirror for t, s in _REGISTRY.items() if s.mirror is not None}",
                "return {str(s.job_type): s.mirror for s in _BUILT_IN if s.mirror is not None}",
            ),
        ),
        (JOB_TYPE_E2E,),
    ),
    Mutation(
        "target-of-hard-coded",
        "the admin API's job target ignores the registry (every target read as a scrap)",
        (
            Edit(
                ADMIN_REPO,
                "    table = spec.target\n",
                '    table = registry.spec_for("CARD_ANALYSIS").target\n',
            ),
        ),
        (JOB_TYPE_E2E,),
    ),
    Mutation(
        "handler-consumer-unchecked",
        "a worker collects a handler of a job type another service consumes",
        (
            Edit(
                HANDLER,
                "if registry.spec_for(job_type).consumer != consumer:",
                "if registry.spec_for(job_type).consumer == object():",
            ),
        ),
        ("tests/unit/test_registry.py::test_a_handler_of_another_workers_type_is_refused",),
    ),
    Mutation(
        "superseded-ignored",
        "recovery re-runs a job whose target another target replaced (the spec's superseded)",
        (
            Edit(
                RECOVERY_REPO,
                "superseded = false() if spec.superseded is None else spec.superseded(target_id)",
                "superseded = false()",
            ),
        ),
        ("tests/recovery/test_sweeps.py::test_failed_sweep_retries_newest_failures_until_the_cap",),
    ),
    Mutation(
        "predicate-unaliased",
        "SCRAP_REFINE's already_done reads scraps unaliased (the scrap sweep correlates it away)",
        (Edit(REGISTRY, 'scrap = _scraps.alias("refined")', "scrap = _scraps"),),
        ("tests/recovery/test_sweeps.py::test_scrap_sweeps_register_missing_jobs",),
    ),
    Mutation(
        "keda-trigger-missing",
        "a job type's queue has no KEDA trigger (the ai-worker would not scale on it)",
        (
            Edit(
                "deploy/k8s/base/autoscaling.yaml",
                'queue="san.jobs.github_star_recommendation"})\n',
                'queue="san.jobs.card_analysis"})\n',
            ),
        ),
        (
            "tests/deploy/test_kubernetes.py"
            "::test_keda_scales_each_worker_on_exactly_its_queues_runnable_work",
        ),
    ),
    Mutation(
        "own-jobs-of-everyone",
        "`GET /async-jobs` lists every user's jobs (the owner filter dropped)",
        (
            Edit(
                "services/api/src/san_api/jobs/repository.py",
                "query = select(AsyncJob).where(AsyncJob.user_id == user_id)",
                "query = select(AsyncJob)",
            ),
        ),
        ("tests/api/test_own_jobs.py::test_a_user_lists_their_own_jobs_and_never_anothers",),
    ),
    Mutation(
        "owner-cancels-anyones-job",
        "`DELETE /async-jobs/{id}` finds the job without its owner",
        (
            Edit(
                "services/api/src/san_api/jobs/endpoints.py",
                "    job = await jobs.get_for_user(session, jobId, user.user_id)\n"
                "    if job is None:\n"
                '        raise NotFound(f"job {jobId} not found")\n'
                "    await cancelling.cancel(",
                "    job = await session.get(AsyncJob, jobId)\n"
                "    if job is None:\n"
                '        raise NotFound(f"job {jobId} not found")\n'
                "    await cancelling.cancel(",
            ),
        ),
        ("tests/api/test_own_jobs.py::test_a_user_cancels_their_own_pending_job_and_only_theirs",),
    ),
    Mutation(
        "started-broker-left-running",
        "the RabbitMQ `make run` started is not stopped with it",
        (Edit("dev/local_broker.py", '["rabbitmqctl", "stop"]', '["true"]'),),
        ("tests/unit/test_local_broker.py::test_a_broker_it_started_is_reported_and_stopped",),
    ),
    Mutation(
        "make-run-port-unchecked",
        "`make run` starts without checking API_PORT (a second run starts every service)",
        (
            Edit(
                "dev/run_local.py",
                '        cli.require_free_port("run", "API_PORT", '
                'env.get("API_HOST", "127.0.0.1"), _api_port(env))\n',
                "",
            ),
        ),
        (
            "tests/e2e/test_startup_errors.py"
            "::test_make_run_on_a_busy_port_fails_fast_with_one_line",
        ),
    ),
    Mutation(
        "quota-ignored",
        "the upstream budget is read but every call is admitted",
        (Edit(QUOTAS, "rr IS NULL OR rr >= 1 AS req_ok", "true AS req_ok"),),
        (
            GITHUB_QUOTA,
            AI_QUOTA,
            "tests/worker/test_upstream_quotas.py"
            "::test_an_unknown_budget_holds_nothing_back_until_an_answer_says",
        ),
    ),
    Mutation(
        "quota-per-process",
        "each worker process keeps a budget of its own: the AI budget is not shared",
        (
            Edit(
                QUOTAS,
                'return f"ai {base_url} {model}"',
                "return f\"ai {base_url} {model} {__import__('os').getpid()}\"",
            ),
        ),
        (AI_QUOTA,),
    ),
    Mutation(
        "active-jobs-unlocked",
        "the active-job cap counts without the user's lock: concurrent requests all see room",
        (
            Edit(
                API_LIMITS,
                "            await repository.lock_user_jobs(connection, user_id)\n",
                "",
            ),
        ),
        (
            "tests/api/test_limits.py::test_a_burst_across_two_api_processes_meets_the_limits"
            "_while_others_are_served",
        ),
    ),
    Mutation(
        "budget-unchecked",
        "the AI budget is never checked: neither at enqueue nor before a job runs",
        (
            Edit(
                USAGE_BUDGETS,
                "    if limits.unlimited:\n        return None\n",
                "    if True:\n        return None\n",
            ),
        ),
        (
            f"{USAGE_BUDGET_TESTS}::test_the_scrap_that_would_cross_the_budget_is_refused_at"
            "_enqueue",
            f"{USAGE_BUDGET_TESTS}::test_a_job_over_budget_at_run_time_waits_or_fails_without"
            "_calling_the_ai",
        ),
    ),
    Mutation(
        "timeout-unenforced",
        "the job type's timeout is not enforced: a hung AI call holds the try",
        (
            Edit(
                EXECUTOR,
                "async with asyncio.timeout(seconds) as deadline:",
                "async with asyncio.timeout(None) as deadline:",
            ),
        ),
        (
            "tests/usage/test_timeouts.py"
            "::test_a_hung_ai_call_times_out_at_the_deadline_and_the_retry_completes",
        ),
    ),
    Mutation(
        "cancel-ignored",
        "the worker ignores a cancel of the job it runs: the AI call is held to its end",
        (
            Edit(
                EXECUTOR,
                "        self._cancelled.add(job_id)\n"
                "        deadline = self._deadlines.get(job_id)",
                "        deadline = None",
            ),
        ),
        (
            "tests/usage/test_cancel.py"
            "::test_the_owner_cancels_a_running_job_and_its_worker_stops_within_2_s",
        ),
    ),
    Mutation(
        "cancel-listener-not-reconnected",
        "a worker whose LISTEN connection was lost stops hearing cancels",
        (
            Edit(
                "libs/common/src/san_common/worker/cancels.py",
                '                DATABASE.lost(exc, "listening for cancels")\n',
                '                DATABASE.lost(exc, "listening for cancels")\n'
                "                return\n",
            ),
        ),
        (
            "tests/usage/test_cancel.py"
            "::test_after_its_listen_connection_is_killed_the_worker_hears_cancels_again",
        ),
    ),
    Mutation(
        "checkpoint-unread",
        "card analysis ignores its checkpoint: a retry asks the chat again and pays twice",
        (
            Edit(
                "services/ai-worker/src/san_ai_worker/handlers/card_analysis.py",
                "analysis = _from_checkpoint(job) or await",
                "analysis = await",
            ),
        ),
        (
            "tests/usage/test_checkpoints.py"
            "::test_a_failed_embedding_retry_reuses_the_chat_answer_and_pays_it_once",
        ),
    ),
    Mutation(
        "fairness-off",
        "the relay ignores its windows: every due row is published at once, oldest first",
        (
            Edit(
                RELAY,
                "            if settings.relay_fair_share\n            else None",
                "            if False\n            else None",
            ),
        ),
        (f"{FAIR_SHARE}::test_one_scrap_of_b_is_not_stuck_behind_300_jobs_of_a[on]",),
    ),
    Mutation(
        "bulk-lane-shared",
        "the relay gives a job queue's bulk lane to another user while it holds the first "
        "one's messages: the second user's backlog waits behind the first's",
        (
            Edit(
                RELAY,
                "            if await self._windows.ready_in(self._broker(), lane) > 0:",
                "            if False:",
            ),
        ),
        (f"{BULK_LANE}::test_the_lane_is_not_given_to_another_user_while_it_holds_the_first_ones",),
    ),
    Mutation(
        "bulk-for-several-users",
        "a batch of one user's rows goes into the bulk lane though other users have work "
        "due: theirs then waits behind it",
        (
            Edit(RELAY_REPO, "AND o.user_id < b.u AND", "AND false AND"),
            Edit(RELAY_REPO, "AND o.user_id > b.u AND", "AND false AND"),
        ),
        (f"{BULK_LANE}::test_with_two_users_due_the_backlog_waits_for_the_fair_claim",),
    ),
    Mutation(
        "bulk-mixes-classes",
        "a user's batch work goes into the bulk lane while their interactive work is due: "
        "the interactive work waits behind it",
        (
            Edit(
                RELAY_REPO,
                "                  AND o.user_id = b.u AND o.priority <> b.p AND",
                "                  AND false AND",
            ),
        ),
        (f"{BULK_LANE}::test_a_users_interactive_work_is_not_put_behind_their_own_batch_work",),
    ),
    Mutation(
        "depths-ignore-bulk-lane",
        "a job queue's depth leaves out its bulk lane: the stranded-message check "
        "re-publishes a backlog waiting there, and the scaling signal misses it",
        (
            Edit(
                DEPTHS,
                "        return Depth(ready=depth.ready + (lane.ready if lane else 0), "
                "consumers=depth.consumers)",
                "        return depth",
            ),
        ),
        (f"{FAIR_SHARE}::test_one_users_backlog_waits_in_the_bulk_lane_and_is_not_stranded",),
    ),
    Mutation(
        "worker-ignores-bulk-lane",
        "workers consume the job queues only: a backlog in a bulk lane never runs",
        (
            Edit(
                CONSUMER,
                "            for queue in (queues[job_type], bulk):",
                "            for queue in (queues[job_type],):",
            ),
        ),
        (f"{FAIR_SHARE}::test_one_scrap_of_b_is_not_stuck_behind_300_jobs_of_a[on]",),
    ),
    Mutation(
        "console-missing-queue-fails",
        "the console's queue page, reading depths by passive declares, fails as a whole on "
        "a queue not declared yet",
        (
            Edit(
                ADMIN_BROKER,
                "                except ChannelNotFoundEntity:",
                "                except ZeroDivisionError:",
            ),
        ),
        ("tests/admin/test_broker.py::test_a_queue_not_declared_is_left_out_not_a_failed_page",),
    ),
    Mutation(
        "window-never-ages",
        "what the consumers took stays in the window after its seconds: a busy spell's "
        "window lets the next backlog into the queue whole",
        (
            Edit(
                RELAY_WINDOW,
                "        while self.taken and now - self.taken[0][0] > horizon:",
                "        while False:",
            ),
        ),
        (
            "tests/relay/test_window.py::"
            "test_the_window_holds_what_the_consumers_took_within_its_seconds",
        ),
    ),
    Mutation(
        "fairness-fifo",
        "the fair claim forgets the users: within a class, oldest first",
        (
            Edit(
                FAIR_SHARE_MIGRATION,
                "row_number() OVER (PARTITION BY r.queue ORDER BY r.eff, r.share, r.id)",
                "row_number() OVER (PARTITION BY r.queue ORDER BY r.eff, r.id)",
            ),
            Edit(
                FAIR_SHARE_MIGRATION,
                "        ORDER BY p.eff, p.share, p.id\n        LIMIT batch",
                "        ORDER BY p.eff, p.id\n        LIMIT batch",
            ),
        ),
        (f"{FAIR_SHARE}::test_one_scrap_of_b_is_not_stuck_behind_300_jobs_of_a[on]",),
    ),
    Mutation(
        "batch-above-interactive",
        "the interactive class sorts after the batch class: the daily batch runs first",
        (
            Edit(
                "libs/common/src/san_common/jobs/admission.py",
                "    INTERACTIVE = 0  #",
                "    INTERACTIVE = 2  #",
            ),
        ),
        (f"{FAIR_SHARE}::test_a_til_b_waits_for_runs_before_the_daily_til_batch",),
    ),
    Mutation(
        "held-result-dropped",
        "a store that lost the database gives the try back (requeue): the next try asks the"
        " AI again",
        (
            Edit(
                EXECUTOR,
                "                        holding = holding or self._hold(claim, exc)\n",
                "                        raise _Outage(exc)\n",
            ),
        ),
        (HELD_THROUGH_OUTAGE,),
    ),
    Mutation(
        "quota-reserve-fails-closed",
        "an upstream quota reservation that lost the database fails the try: an answer in"
        " hand (a card's chat) is asked for again",
        (
            Edit(
                QUOTAS,
                "            if not is_connection_loss(exc):\n                raise\n"
                '            outages.DATABASE.lost(exc, "reserving an upstream quota")\n',
                "            raise\n",
            ),
        ),
        (HELD_THROUGH_OUTAGE,),
    ),
    Mutation(
        "ledger-counts-twice",
        "the ledger writes a try's calls again when they are written again",
        (
            Edit(
                "libs/common/src/san_common/usage/ledger.py",
                "WHERE NOT EXISTS (\n",
                "WHERE $1::uuid[] IS NOT NULL OR NOT EXISTS (\n",
            ),
        ),
        ("tests/usage/test_ledger.py::test_a_try_s_calls_written_again_are_counted_once",),
    ),
    Mutation(
        "heartbeat-warns-each-beat",
        "a heartbeat lost to a database outage is a WARNING every beat, not the outage's one",
        (
            Edit(
                LEASES_KEEPER,
                "                if failure is not None and is_connection_loss(failure):\n",
                "                if failure is not None and not failure:\n",
            ),
        ),
        (HELD_THROUGH_OUTAGE,),
    ),
    Mutation(
        "quota-wait-unrecorded",
        "a job refused by the upstream quota waits without saying what for",
        (
            Edit(
                EXECUTOR,
                "waiting_for=exc.waiting_for if isinstance(exc, SystemWait) else None,",
                "waiting_for=None,",
            ),
        ),
        (WAITING_VISIBLE,),
    ),
    Mutation(
        "runnable-counts-future-messages",
        "the scaling signal counts outbox messages not due yet (jobs waiting for a reset)",
        (
            Edit(
                RUNNABLE,
                "WHERE published_at IS NULL AND available_at <= now()",
                "WHERE published_at IS NULL",
            ),
        ),
        (
            f"{RUNNABLE_TESTS}::test_runnable_work_is_counted_wherever_it_is_and_quota_waits_are_not",
            WAITING_VISIBLE,
        ),
    ),
    Mutation(
        "runnable-ignores-quota-room",
        "at a quota's reset, the scaling signal counts every job that waited for it",
        (Edit(RUNNABLE, "self.running - self.beyond_quota)", "self.running)"),),
        (
            f"{RUNNABLE_TESTS}::test_at_the_reset_only_as_many_waiting_jobs_as_the_quota_admits_count",
        ),
    ),
    Mutation(
        "fair-share-unseen",
        "a job its queue's fair-share window holds back says it waits for nothing",
        (Edit(JOBS_ENDPOINTS, '    if held:\n        return "fair-share", None\n', ""),),
        (WAITING_FAIR,),
    ),
    Mutation(
        "queue-depth-cached",
        "a queue's depth is read once and then answered from the channel's cache",
        (Edit(DEPTHS, "passive=True, robust=False)", "passive=True)"),),
        (
            f"{RUNNABLE_TESTS}::test_runnable_work_is_counted_wherever_it_is_and_quota_waits_are_not",
        ),
    ),
    Mutation(
        "log-line-redacts-the-message-only",
        "a JSON log line's fields are cleared by the message's redaction alone",
        (Edit(LOGS, "if _redact(joined) != joined:", "if _redact(msg) != msg:"),),
        (LOG_SECRETS,),
    ),
    Mutation(
        "redact-hint-missing",
        "a text without `=` is spared the secret patterns (bearer tokens pass)",
        (Edit(ERRORS, '"bearer", "token", "=", "sk-")', '"=",)'),),
        (LOG_SECRETS,),
    ),
    Mutation(
        "direct-mark-before-confirm",
        "the API marks its direct rows published before the broker confirmed them",
        (
            Edit(
                DIRECT,
                "        began = time.monotonic()\n        async with self._in_flight:\n",
                "        began = time.monotonic()\n"
                "        await self._mark_confirmed([row.id for row in rows])\n"
                "        async with self._in_flight:\n",
            ),
        ),
        (
            f"{PUBLISH_AFTER_COMMIT}::"
            "test_killed_between_commit_and_publish_the_relay_publishes_after_the_grace",
        ),
    ),
    Mutation(
        "direct-due-at-once",
        "a direct row is due for the relay at once (no grace): both publish every job",
        (
            Edit(
                REGISTRATION,
                "now() + make_interval(secs => $10::float8)",
                "now() + make_interval(secs => 0 * $10::float8)",
            ),
        ),
        (
            f"{PUBLISH_AFTER_COMMIT}::"
            "test_the_api_publishes_and_marks_within_the_grace_and_the_relay_publishes_nothing",
            f"{PUBLISH_AFTER_COMMIT}::"
            "test_killed_between_publish_and_mark_the_duplicate_is_completed_once",
        ),
    ),
    Mutation(
        "direct-for-every-job",
        "every job the API registers is published directly, past the relay's fair window",
        (Edit(REGISTRATION, "    SELECT NOT EXISTS (\n", "    SELECT true OR EXISTS (\n"),),
        (
            f"{PUBLISH_AFTER_COMMIT}::test_a_users_second_active_job_of_a_type_goes_through_the_relay",
        ),
    ),
    Mutation(
        "stranded-ignores-direct",
        "the stranded check counts a direct row waiting for the relay only once it is due",
        (
            Edit(
                RECOVERY_REPO,
                "and_(OutboxMessage.direct, OutboxMessage.created_at < cutoff)",
                "false()",
            ),
        ),
        (
            f"{MAINTENANCE_TESTS}::test_jobs_whose_direct_publish_waits_for_the_relay_are_not_missing",
        ),
    ),
)


@dataclass(frozen=True)
class Result:
    mutation: Mutation
    verdict: str  # caught | survived | stale | error
    seconds: float
    detail: str = ""
    failed: tuple[str, ...] = ()  # the catchers that turned red


def copy_tree(source: Path, target: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        relative = raw.decode()
        origin = source / relative
        if not origin.is_file():
            continue  # deleted in the working tree
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, destination)


def apply(mutation: Mutation, tree: Path) -> str | None:
    """Apply every edit; the reason it cannot be applied, or None."""
    for edit in mutation.edits:
        path = tree / edit.path
        source = path.read_text() if path.exists() else ""
        count = source.count(edit.old)
        if count != 1:
            return f"{edit.path}: original text found {count} times"
        path.write_text(source.replace(edit.old, edit.new))
    return None


def pytest_env(tree: Path) -> dict[str, str]:
    sources = [tree / "libs/common/src", *sorted((tree / "services").glob("*/src"))]
    # Ahead of the editable installs, so the copy's (mutated) packages are the ones imported,
    # by the tests and by every service process they start.
    path = os.pathsep.join(str(s) for s in sources)
    previous = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": path + (os.pathsep + previous if previous else "")}


def run_tests(tree: Path, node_ids: tuple[str, ...], log: Path) -> int:
    with log.open("w") as out:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *node_ids],
            cwd=tree,
            env=pytest_env(tree),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode


def run_one(mutation: Mutation, workdir: Path) -> Result:
    started = time.monotonic()
    tree = workdir / mutation.name
    copy_tree(ROOT, tree)
    if (problem := apply(mutation, tree)) is not None:
        return Result(mutation, "stale", time.monotonic() - started, problem)
    log = workdir / f"{mutation.name}.log"
    code = run_tests(tree, mutation.catchers, log)
    elapsed = time.monotonic() - started
    if code == 1:
        failed = _failures(log)
        return Result(mutation, "caught", elapsed, f"{len(failed)} red", failed)
    if code == 0:
        return Result(mutation, "survived", elapsed)
    return Result(mutation, "error", elapsed, f"pytest exit {code}, see {log}")


def baseline(workdir: Path) -> int:
    """Every catcher passes on the unmutated tree (else 'caught' would mean nothing)."""
    tree = workdir / "baseline"
    copy_tree(ROOT, tree)
    catchers = tuple(dict.fromkeys(c for m in MUTATIONS for c in m.catchers))
    return run_tests(tree, catchers, workdir / "baseline.log")


def _failures(log: Path) -> tuple[str, ...]:
    """Node ids of the failed tests, from pytest's short summary."""
    failed = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            failed.append(line.split(" ", 1)[1].split(" - ")[0].strip())
    return tuple(failed)


def _turned_red(catcher: str, failed: tuple[str, ...]) -> bool:
    """A parametrized catcher turned red when any of its cases did."""
    return any(f == catcher or f.startswith(catcher + "[") for f in failed)


def table(results: list[Result]) -> str:
    lines = [
        "| mutation | catching tests (✗ = turned red) | result |",
        "|---|---|---|",
    ]
    for r in results:
        # Each catcher, marked with whether it turned red under this mutation.
        catchers = "<br>".join(
            f"`{c.split('::')[-1]}`" + (" ✗" if _turned_red(c, r.failed) else "")
            for c in r.mutation.catchers
        )
        lines.append(f"| {r.mutation.what} | {catchers} | {r.verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.mutations")
    parser.add_argument("--only", action="append", help="run only this mutation (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--keep", action="store_true", help="keep the mutated copies and logs")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:28} {m.what}")
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="san-mutants-"))
    try:
        if not args.no_baseline:
            code = baseline(workdir)
            if code != 0:
                print(f"baseline failed (pytest exit {code}): see {workdir}/baseline.log")
                args.keep = True
                return 2
            print("baseline: every catching test passes unmutated")
        results = []
        for mutation in chosen:
            result = run_one(mutation, workdir)
            results.append(result)
            print(f"{result.verdict:9} {mutation.name:28} {result.seconds:5.1f}s {result.detail}")
            if not args.keep:
                shutil.rmtree(workdir / mutation.name, ignore_errors=True)
        print()
        print(table(results))
        if any(r.verdict != "caught" for r in results):
            args.keep = True
            return 1
        return 0
    finally:
        if args.keep:
            print(f"\nmutated copies and logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
