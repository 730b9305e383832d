"""Acceptance 7: `san-admin` verbs against a running API (uvicorn on loopback, real broker),
and a non-zero exit with one clear line on bad input."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest

from san_api.admin.cli import build_parser, run
from san_api.app import create_app
from san_common.broker.topology import Topology
from san_common.models import UserBudget
from san_common.usage import AiCall, TryUsage, ledger
from san_common.worker.presence import Presence
from tests.admin.support import Sessions, insert_jobs, new_user, operator_headers, user_headers
from tests.api.support import over_http
from tests.conftest import api_settings

pytestmark = pytest.mark.rabbit

TOKEN = operator_headers("cli-operator")["Authorization"].removeprefix("Bearer ")


@pytest.fixture
async def url(db_url: str, amqp_url: str, topology: Topology) -> AsyncIterator[str]:
    settings = api_settings(db_url, amqp_url, amqp_prefix=topology.prefix)
    async with over_http(create_app(settings)) as base:
        yield base


async def admin(url: str, *argv: str, token: str = TOKEN) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(run, ["--url", url, "--token", token, *argv], out, err)
    return code, out.getvalue(), err.getvalue()


async def test_verbs_work_against_a_running_api(url: str, sessions: Sessions) -> None:
    user_id, external = await new_user(sessions)
    [failed, other] = await insert_jobs(sessions, user_id, 2)
    [pending] = await insert_jobs(sessions, user_id, status="PENDING", job_type="SCRAP_REFINE")

    code, out, _ = await admin(
        url, "--json", "jobs", "list", "--user", external, "--status", "FAILED"
    )
    assert code == 0 and {j["jobId"] for j in json.loads(out)["items"]} == {str(failed), str(other)}
    code, out, _ = await admin(url, "jobs", "show", str(failed))
    assert code == 0 and "FAILED" in out and "CARD_ANALYSIS failed: boom" in out
    code, out, _ = await admin(url, "jobs", "retry", str(failed))
    assert (code, out.strip()) == (0, f"{failed} PENDING")
    code, out, _ = await admin(url, "jobs", "retry", "--where", "--user", external, "--dry-run")
    assert (code, out.strip()) == (0, "retry: would touch 1 job(s)")
    code, out, _ = await admin(
        url, "jobs", "cancel", "--where", "--user", external, "--type", "SCRAP_REFINE"
    )
    assert (code, out.strip()) == (0, "cancel: touched 1 job(s)")
    code, out, _ = await admin(url, "--json", "queues", "list")
    assert code == 0 and json.loads(out)["source"] == "passive"
    code, out, _ = await admin(url, "queues", "pause", "CARD_ANALYSIS")
    assert (code, out.strip()) == (0, "CARD_ANALYSIS paused")
    code, out, _ = await admin(url, "queues", "resume", "CARD_ANALYSIS")
    assert (code, out.strip()) == (0, "CARD_ANALYSIS running")
    code, out, _ = await admin(url, "dlq", "list")
    assert code == 0 and "total: 0" in out
    code, out, _ = await admin(url, "dlq", "redrive", "--all")
    assert (code, out.strip()) == (0, "redrive: 0 re-driven, 0 not re-drivable, 0 failed")
    code, out, _ = await admin(url, "sweeps", "run", "retention")
    assert code == 0 and out.startswith("requested #")
    code, out, _ = await admin(url, "audit", "--limit", "5")
    assert code == 0 and "cli-operator" in out and "sweeps.run" in out
    assert pending  # cancelled by the bulk cancel above


async def test_bad_input_exits_non_zero_with_a_clear_message(url: str, sessions: Sessions) -> None:
    user_id, external = await new_user(sessions)
    [done] = await insert_jobs(sessions, user_id, status="COMPLETED")
    cases = [
        (("jobs", "show", "not-a-uuid"), 2, "VALIDATION_ERROR"),
        (("jobs", "show", str(uuid.uuid4())), 4, "NOT_FOUND"),
        (("jobs", "retry", str(done)), 5, "only FAILED jobs can be retried"),
        (("jobs", "retry"), 2, "give a JOB_ID or --where"),
        (("queues", "pause", "NOPE"), 2, "VALIDATION_ERROR"),
        (("sweeps", "run", "nope"), 2, "unknown sweep"),
    ]
    for argv, code, message in cases:
        got, _out, err = await admin(url, *argv)
        assert got == code and message in err and err.count("\n") == 1, (argv, got, err)
    user_token = user_headers(external)["Authorization"].removeprefix("Bearer ")
    got, _, err = await admin(url, "jobs", "list", token=user_token)
    assert got == 3 and "FORBIDDEN" in err
    got, _, err = await admin("http://127.0.0.1:1", "jobs", "list")
    assert got == 1 and "cannot reach the API" in err


async def test_workers_stats_and_outbox(url: str, sessions: Sessions) -> None:
    user_id, external = await new_user(sessions)
    await insert_jobs(sessions, user_id, 2)
    await Presence(sessions, worker_id="w-1", job_types=["CARD_ANALYSIS"], interval=5).beat()
    code, out, _ = await admin(url, "workers")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["WORKER", "HOST", "JOB", "TYPES", "IN", "FLIGHT",
                                              "LAST", "BEAT", "STATE"]  # fmt: skip
    assert lines[1].startswith("w-1 ") and "CARD_ANALYSIS" in lines[1] and "alive" in lines[1]
    assert lines[-1] == "alive: 1 of 1"
    code, out, _ = await admin(url, "--json", "stats")
    stats = json.loads(out)
    assert (
        code == 0
        and {"jobType": "CARD_ANALYSIS", "status": "FAILED", "count": 2} in (stats["totals"])
    )
    assert {"minutes", "jobTypes", "queues"} <= set(stats)
    code, out, _ = await admin(url, "stats", "--minutes", "30")
    assert code == 0 and "last 30 min, jobs finished:" in out and "WAIT P95" in out
    assert "OLDEST DUE" in out
    code, out, _ = await admin(url, "outbox")
    assert (code, out.strip()) == (0, "unpublished: 0")
    # enum options in any case
    code, out, _ = await admin(
        url, "--json", "jobs", "list", "--status", "failed", "--type", "card_analysis"
    )
    assert code == 0 and len(json.loads(out)["items"]) == 2
    code, out, _ = await admin(url, "queues", "pause", "card_analysis")
    assert (code, out.strip()) == (0, "CARD_ANALYSIS paused")
    code, _, err = await admin(url, "jobs", "list", "--status", "failing")
    assert code == 2 and "VALIDATION_ERROR" in err and err.count("\n") == 1
    assert external


COMMANDS = [
    [], ["jobs"], ["jobs", "list"], ["jobs", "show"], ["jobs", "retry"], ["jobs", "cancel"],
    ["dlq"], ["dlq", "list"], ["dlq", "redrive"], ["dlq", "purge"], ["queues"],
    ["queues", "list"], ["queues", "pause"], ["queues", "resume"], ["sweeps"],
    ["sweeps", "list"], ["sweeps", "run"], ["workers"], ["stats"], ["outbox"], ["audit"],
    ["budget"], ["budget", "set"], ["usage"],
]  # fmt: skip


def _entries(help_text: str) -> list[tuple[str, str]]:
    """(option or argument, its help) for each entry of a --help's argument sections."""
    entries: list[tuple[str, str]] = []
    section = False
    for line in help_text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            section = line in ("options:", "positional arguments:")
            continue
        if not section or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 2:
            name, _, rest = line.strip().partition("  ")
            entries.append((name, rest.strip()))
        elif entries and not entries[-1][1]:
            entries[-1] = (entries[-1][0], line.strip())
    return entries


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "san-admin")
def test_every_option_has_help(command: list[str]) -> None:
    parser = build_parser()
    out = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stdout(out):
        parser.parse_args([*command, "--help"])
    entries = _entries(out.getvalue())
    assert entries, out.getvalue()
    missing = [name for name, text in entries if not text and name != "COMMAND" and name != "VERB"]
    assert not missing, (command, missing)


def test_the_console_script_is_installed_and_checks_its_arguments() -> None:
    script = [sys.executable, "-m", "san_api.admin.cli"]
    usage = subprocess.run([*script, "jobs", "frobnicate"], capture_output=True, text=True)
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    missing = subprocess.run([*script, "jobs", "list"], capture_output=True, text=True, env={})
    assert missing.returncode == 2 and "no operator token" in missing.stderr
    help_ = subprocess.run([*script, "--help"], capture_output=True, text=True)
    assert help_.returncode == 0 and "jobs list" in help_.stdout


async def test_bulk_retry_says_what_it_skips_as_superseded(url: str, sessions: Sessions) -> None:
    user_id, external = await new_user(sessions)
    target = uuid.uuid4()
    [old] = await insert_jobs(sessions, user_id, target_id=target)
    await insert_jobs(sessions, user_id, target_id=target, status="COMPLETED")  # took its place
    await insert_jobs(sessions, user_id)  # a failure nobody followed up: retried
    code, out, _ = await admin(url, "jobs", "retry", "--where", "--user", external, "--dry-run")
    assert code == 0
    assert out.splitlines() == [
        "retry: would touch 1 job(s)",
        "retry: skipped 1 job(s), superseded: a newer job of the same target and type exists",
    ]
    code, out, err = await admin(url, "jobs", "retry", str(old))
    assert code != 0 and "superseded" in err


async def test_budget_set_and_usage(url: str, sessions: Sessions) -> None:
    user_id, external = await new_user(sessions)
    code, out, err = await admin(
        url, "budget", "set", str(user_id), "--tokens-per-day", "5000", "--usd-per-month", "2.5"
    )
    assert (code, out.strip()) == (0, f"{user_id} tokens/day 5000, USD/month 2.5"), err
    async with sessions() as session:
        row = await session.get(UserBudget, user_id)
    assert row is not None and (row.tokens_per_day, row.usd_per_month) == (5000, Decimal("2.5"))
    # an option left out is the default again (unlimited in these settings)
    code, out, _ = await admin(
        url, "--json", "budget", "set", str(user_id), "--tokens-per-day", "7"
    )
    assert code == 0 and json.loads(out) == {
        "userId": str(user_id), "tokensPerDay": 7, "usdPerMonth": 0.0,
    }  # fmt: skip
    code, out, _ = await admin(url, "audit")
    assert code == 0 and "user.budget" in out and str(user_id) in out
    cases = [
        (("budget", "set", str(uuid.uuid4()), "--tokens-per-day", "1"), 4, "NOT_FOUND"),
        (("budget", "set", str(user_id), "--tokens-per-day", "-1"), 2, "VALIDATION_ERROR"),
        (("budget", "set", str(user_id), "--usd-per-month", "lots"), 2, "VALIDATION_ERROR"),
    ]
    for argv, want, message in cases:
        got, _out, err = await admin(url, *argv)
        assert got == want and message in err and err.count("\n") == 1, (argv, got, err)
    user_token = user_headers(external)["Authorization"].removeprefix("Bearer ")
    got, _, err = await admin(url, "budget", "set", str(user_id), token=user_token)
    assert got == 3 and "FORBIDDEN" in err

    [job_id] = await insert_jobs(sessions, user_id, status="COMPLETED")
    call = AiCall("m", "chat", 300, 20, 0, False, 5, Decimal("0.0042"))
    async with sessions() as session, session.begin():
        await ledger.insert(session, [TryUsage(job_id, 1, user_id, "CARD_ANALYSIS", [call])])
    code, out, _ = await admin(url, "usage", "--days", "7")
    rows = [line.split() for line in out.splitlines()]
    assert code == 0 and ["CARD_ANALYSIS", "320", "0.0042", "1"] in rows
    assert [external, "320", "0.0042", "1"] in rows
