"""`san-admin`: the operator console's verbs from a shell, over the admin API.

    san-admin jobs list [--id PREFIX] [--status S]... [--type T]... [--user U] [--error TEXT]
    san-admin jobs show JOB_ID
    san-admin jobs retry JOB_ID | --where [filters] [--dry-run]
    san-admin jobs cancel JOB_ID | --where [filters] [--dry-run]
    san-admin dlq list [--limit N]
    san-admin dlq redrive|purge (--message-id ID | --type T | --all)
    san-admin queues list | pause TYPE | resume TYPE
    san-admin sweeps list | run SWEEP...
    san-admin workers
    san-admin stats [--minutes N]
    san-admin outbox
    san-admin audit [--limit N]
    san-admin budget set USER_ID [--tokens-per-day N] [--usd-per-month X]
    san-admin usage [--days N]

The API is `--url` (or SAN_ADMIN_URL, default http://127.0.0.1:8000) and the operator
token `--token` (or SAN_ADMIN_TOKEN; `san-token --operator NAME` mints one). `--json`
prints the API's JSON. Statuses and job types are accepted in any case. Exit codes: 0 done;
1 the API is unreachable or failed (5xx), or a dead letter asked to be re-driven was not
(each is listed, with why);
2 bad usage or input (400); 3 not allowed (401/403); 4 not found (404); 5 the job's state
does not allow it (409).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import httpx

from san_common import cli
from san_common.jobs.types import JobStatus, JobType

PROG = "san-admin"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DENIED, EXIT_NOT_FOUND, EXIT_CONFLICT = 0, 1, 2, 3, 4, 5
_BY_STATUS = {400: EXIT_USAGE, 401: EXIT_DENIED, 403: EXIT_DENIED, 404: EXIT_NOT_FOUND,
              409: EXIT_CONFLICT, 422: EXIT_USAGE}  # fmt: skip


class Failure(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


STATUSES = [s.value for s in JobStatus]
JOB_TYPES = [t.value for t in JobType]


def _upper(value: str) -> str:
    """Enum options in any case: `--status failed` is FAILED. An unknown value is the
    API's to refuse (one line, exit 2), like every other bad input."""
    return value.strip().upper()


def _job_type(parser: argparse._ActionsContainer, help: str, **kwargs: Any) -> None:
    parser.add_argument(
        "--type",
        type=_upper,
        metavar="JOB_TYPE",
        help=f"{help} ({', '.join(JOB_TYPES)}; any case)",
        **kwargs,
    )


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--id", metavar="PREFIX", help="the job id, or the start of it")
    parser.add_argument(
        "--status",
        type=_upper,
        metavar="STATUS",
        action="append",
        default=[],
        help=f"only jobs in this status ({', '.join(STATUSES)}; any case; repeatable)",
    )
    _job_type(parser, "only jobs of this type; repeatable", action="append", default=[])
    parser.add_argument("--user", help="the owner's external id (or user id)")
    parser.add_argument("--error", help="text the error message contains")
    parser.add_argument("--created-from", metavar="ISO8601", help="created at or after (with zone)")
    parser.add_argument("--created-to", metavar="ISO8601", help="created before (with zone)")


def _limit(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--limit", type=int, default=50, help=f"at most this many {what}")


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser(PROG, __doc__ or "", distribution="san-api")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--url",
        default=os.environ.get("SAN_ADMIN_URL", "http://127.0.0.1:8000"),
        help="the API's base URL (SAN_ADMIN_URL; default http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("SAN_ADMIN_TOKEN", ""),
        help="an operator token (SAN_ADMIN_TOKEN; `san-token --operator NAME` mints one)",
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the API (default 30)"
    )
    nouns = parser.add_subparsers(dest="noun", required=True, metavar="COMMAND")

    jobs = nouns.add_parser("jobs", help="list, show, retry or cancel jobs").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    listing = jobs.add_parser("list", help="jobs newest first, filtered")
    _filters(listing)
    _limit(listing, "jobs")
    listing.add_argument("--cursor", help="the page after the one that printed it")
    jobs.add_parser("show", help="one job with its history").add_argument(
        "job_id", help="the job's id"
    )
    for verb in ("retry", "cancel"):
        action = jobs.add_parser(verb, help=f"{verb} one job, or every job the filters match")
        action.add_argument("job_id", nargs="?", help="the job's id (or use --where)")
        action.add_argument("--where", action="store_true", help="every job the filters match")
        action.add_argument("--dry-run", action="store_true", help="only count (with --where)")
        _filters(action)

    dlq = nouns.add_parser("dlq", help="dead letters").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    _limit(dlq.add_parser("list", help="dead letters in queue order"), "dead letters")
    for verb in ("redrive", "purge"):
        action = dlq.add_parser(verb, help=f"{verb} dead letters")
        chosen = action.add_mutually_exclusive_group(required=True)
        chosen.add_argument("--message-id", help="the one with this message id")
        _job_type(chosen, "those of this job type")
        chosen.add_argument("--all", action="store_true", help="all of them")

    queues = nouns.add_parser("queues", help="queue depths; pause or resume a job type")
    verbs = queues.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs.add_parser("list", help="every queue: ready, unacked, consumers, paused")
    for verb in ("pause", "resume"):
        verbs.add_parser(verb, help=f"{verb} every worker's consumer of a job type").add_argument(
            "job_type", type=_upper, metavar="JOB_TYPE",
            help=f"the job type ({', '.join(JOB_TYPES)}; any case)",
        )  # fmt: skip

    sweeps = nouns.add_parser("sweeps", help="recovery sweeps").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    sweeps.add_parser("list", help="recent sweep runs")
    sweeps.add_parser("run", help="ask the recovery service to run sweeps now").add_argument(
        "sweeps", nargs="+", metavar="SWEEP", help="sweep names, or `all`"
    )

    nouns.add_parser("workers", help="worker processes, their jobs and last heartbeat")
    nouns.add_parser("stats", help="jobs by status; wait and run time; oldest due").add_argument(
        "--minutes", type=int, default=60, help="the window of the percentiles (default 60)"
    )
    nouns.add_parser("outbox", help="messages the relay has not published yet")
    _limit(nouns.add_parser("audit", help="operator actions, newest first"), "actions")

    budget = nouns.add_parser("budget", help="a user's AI budget").add_subparsers(
        dest="verb", required=True, metavar="VERB"
    )
    setting = budget.add_parser("set", help="set a user's AI budget (audited)")
    setting.add_argument("user_id", help="the user's id (a UUID)")
    setting.add_argument(
        "--tokens-per-day", type=int, metavar="N", help="tokens per UTC day; 0: unlimited"
    )
    setting.add_argument(
        "--usd-per-month", metavar="X", help="US dollars per UTC month; 0: unlimited"
    )
    nouns.add_parser("usage", help="AI tokens and cost per day, job type and user").add_argument(
        "--days", type=int, default=30, help="UTC days, today included (default 30)"
    )
    return parser


def _filter_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if getattr(args, "id", None):
        body["jobId"] = args.id
    if args.status:
        body["status"] = args.status
    if args.type:
        body["type"] = args.type
    for key, name in (("user", "user"), ("error", "error"), ("created_from", "createdFrom"),
                      ("created_to", "createdTo")):  # fmt: skip
        if getattr(args, key, None):
            body[name] = getattr(args, key)
    return body


class Api:
    def __init__(self, url: str, token: str, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self._url = url

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise Failure(f"cannot reach the API at {cli.redact_url(self._url)}: {exc}", 1) from exc
        if response.status_code >= 400:
            try:
                problem = response.json()
                detail = f"{problem.get('code', 'ERROR')}: {problem.get('detail', response.text)}"
            except ValueError:
                detail = response.text[:300]
            code = _BY_STATUS.get(response.status_code, EXIT_FAILED)
            raise Failure(f"{response.status_code} {detail}", code)
        return response.json() if response.content else None

    def close(self) -> None:
        self._client.close()


def _table(out: TextIO, rows: Sequence[Sequence[object]], header: Sequence[str]) -> None:
    cells = [[str(c) for c in header], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _reason(letter: dict[str, Any]) -> str:
    reason = letter["reason"] or "?"
    if letter["deadLetteredBy"] == "broker" and letter["deaths"] > 1:
        reason += f" ×{letter['deaths']}"
    return f"{reason}: {letter['detail'][:60]}" if letter["detail"] else reason


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    return f"{value / 60:.1f}m" if value < 7200 else f"{value / 3600:.1f}h"


def _workers(out: TextIO, result: dict[str, Any]) -> None:
    rows = [
        (w["workerId"], w["host"], ",".join(w["jobTypes"]), w["inFlight"],
         f"{_seconds(w['silentSeconds'])} ago", "alive" if w["alive"] else "SILENT")
        for w in result["items"]
    ]  # fmt: skip
    _table(out, rows, ("WORKER", "HOST", "JOB TYPES", "IN FLIGHT", "LAST BEAT", "STATE"))
    print(f"alive: {result['alive']} of {len(result['items'])}", file=out)


def _stats(out: TextIO, result: dict[str, Any]) -> None:
    counts: dict[str, dict[str, int]] = {}
    for cell in result["totals"]:
        counts.setdefault(cell["jobType"], {})[cell["status"]] = cell["count"]
    _table(out, [(t, *(c.get(s, 0) for s in STATUSES)) for t, c in sorted(counts.items())],
           ("JOB TYPE", *STATUSES))  # fmt: skip
    print(f"\nlast {result['minutes']} min, jobs finished:", file=out)
    _table(out, [(t["jobType"], t["finished"], _seconds(t["waitP50"]), _seconds(t["waitP95"]),
                  _seconds(t["runP50"]), _seconds(t["runP95"])) for t in result["jobTypes"]],
           ("JOB TYPE", "FINISHED", "WAIT P50", "WAIT P95", "RUN P50", "RUN P95"))  # fmt: skip
    print("\npending, by queue:", file=out)
    _table(out, [(q["queue"], q["pending"], q["due"], _seconds(q["oldestDueSeconds"]))
                 for q in result["queues"]],
           ("QUEUE", "PENDING", "DUE", "OLDEST DUE"))  # fmt: skip


def _usage(out: TextIO, result: dict[str, Any]) -> None:
    header = ("TOKENS", "COST USD", "JOBS")

    def cells(s: dict[str, Any]) -> tuple[object, ...]:
        return (s["tokens"], f"{s['costUsd']:.4f}", s["jobs"])

    print(f"since {result['since']} (UTC), per day:", file=out)
    _table(out, [(s["day"], *cells(s)) for s in result["perDay"]], ("DAY", *header))
    print("\nper job type:", file=out)
    _table(out, [(s["jobType"], *cells(s)) for s in result["perJobType"]], ("JOB TYPE", *header))
    print("\nper user:", file=out)
    _table(out, [(s["user"] or s["userId"], *cells(s)) for s in result["perUser"]],
           ("USER", *header))  # fmt: skip


def execute(args: argparse.Namespace, api: Api, out: TextIO) -> None:
    """Raises `Failure` when the API refused, or when some of what was asked was not done
    (dead letters not re-driven: exit 1, after the report)."""
    noun, verb = args.noun, getattr(args, "verb", None)
    result: Any
    incomplete: str | None = None
    if noun == "jobs" and verb == "list":
        params: dict[str, Any] = {**_filter_body(args), "limit": args.limit}
        if args.cursor:
            params["cursor"] = args.cursor
        result = api.call("GET", "/admin/api/jobs", params=params)
        if not args.json:
            _table(out, [(j["jobId"], j["jobType"], j["status"], j["user"], j["attempt"],
                          (j["errorMessage"] or "")[:60]) for j in result["items"]],
                   ("JOB", "TYPE", "STATUS", "USER", "ATTEMPT", "ERROR"))  # fmt: skip
            if result["nextCursor"]:
                print(f"more: --cursor {result['nextCursor']}", file=out)
    elif noun == "jobs" and verb == "show":
        result = api.call("GET", f"/admin/api/jobs/{args.job_id}")
        if not args.json:
            job = result["job"]
            for key in ("jobId", "jobType", "status", "user", "targetId", "attempt", "createdAt",
                        "finishedAt", "workerId", "leaseExpiresAt", "errorMessage"):  # fmt: skip
                print(f"{key:15} {job[key]}", file=out)
            print("history        " + " → ".join(e["status"] for e in result["events"]), file=out)
    elif noun == "jobs":
        if bool(args.job_id) == bool(args.where):
            raise Failure(f"jobs {verb}: give a JOB_ID or --where with filters", EXIT_USAGE)
        if args.job_id:
            result = api.call("POST", f"/admin/api/jobs/{args.job_id}/{verb}")
            if not args.json:
                print(f"{result['jobId']} {result['status']}", file=out)
        else:
            body = {"action": verb, "filter": _filter_body(args)}
            path = "/admin/api/jobs/bulk/preview" if args.dry_run else "/admin/api/jobs/bulk"
            result = api.call("POST", path, json=body)
            if not args.json:
                done = "would touch" if args.dry_run else "touched"
                print(f"{verb}: {done} {result['count']} job(s)", file=out)
                for reason, count in result.get("skipped", {}).items():
                    print(f"{verb}: skipped {count} job(s), {reason}", file=out)
    elif noun == "dlq" and verb == "list":
        result = api.call("GET", "/admin/api/dead-letters", params={"limit": args.limit})
        if not args.json:
            _table(out, [(m["messageId"], m["deadLetteredAt"] or "?", m["jobType"] or "?",
                          m["jobId"] or "", _reason(m), m["queue"] or "?",
                          m["jobStatus"] or "", (m["jobError"] or "")[:50])
                         for m in result["items"]],
                   ("MESSAGE", "DEAD-LETTERED", "TYPE", "JOB", "REASON", "FROM QUEUE",
                    "JOB STATUS", "JOB ERROR"))  # fmt: skip
            print(f"total: {result['total']}", file=out)
    elif noun == "dlq":
        body = {"all": True} if args.all else (
            {"messageId": args.message_id} if args.message_id else {"jobType": args.type}
        )  # fmt: skip
        result = api.call("POST", f"/admin/api/dead-letters/{verb}", json=body)
        if not args.json:
            for item in result["items"]:
                if item["result"] in ("not-redrivable", "failed"):
                    print(f"{item['messageId']}: {item['result']}: {item['reason']}", file=out)
            if verb == "redrive":
                print(f"redrive: {result['count']} re-driven, {result['notRedrivable']} not"
                      f" re-drivable, {result['failed']} failed", file=out)  # fmt: skip
            else:
                print(f"purge: {result['count']} dead letter(s) dropped", file=out)
        left = result["notRedrivable"] + result["failed"]
        if left:  # after the report, so that --json still prints it
            incomplete = f"redrive: {left} of the selected dead letter(s) not re-driven"
    elif noun == "queues" and verb == "list":
        result = api.call("GET", "/admin/api/queues")
        if not args.json:
            _table(out, [(q["name"], q["messages"], q["unacked"], q["consumers"],
                          "paused" if q["paused"] else "") for q in result["queues"]],
                   ("QUEUE", "READY", "UNACKED", "CONSUMERS", "STATE"))  # fmt: skip
    elif noun == "queues":
        result = api.call("POST", f"/admin/api/job-types/{args.job_type}/{verb}")
        if not args.json:
            print(f"{result['jobType']} {'paused' if result['paused'] else 'running'}", file=out)
    elif noun == "sweeps" and verb == "list":
        result = api.call("GET", "/admin/api/sweeps")
        if not args.json:
            _table(out, [(r["startedAt"], r["sweep"], r["trigger"], r["status"],
                          json.dumps(r["totals"])) for r in result["runs"]],
                   ("STARTED", "SWEEP", "TRIGGER", "STATUS", "TOTALS"))  # fmt: skip
    elif noun == "sweeps":
        result = api.call("POST", "/admin/api/sweeps/run", json={"sweeps": args.sweeps})
        if not args.json:
            print(f"requested #{result['id']}: {', '.join(result['sweeps'])}", file=out)
    elif noun == "workers":
        result = api.call("GET", "/admin/api/workers")
        if not args.json:
            _workers(out, result)
    elif noun == "stats":
        totals = api.call("GET", "/admin/api/stats", params={"hours": 1})
        timings = api.call("GET", "/admin/api/timings", params={"minutes": args.minutes})
        result = {"totals": totals["totals"], **timings}
        if not args.json:
            _stats(out, result)
    elif noun == "outbox":
        result = api.call("GET", "/admin/api/outbox")
        if not args.json:
            age = result["oldestAgeSeconds"]
            oldest = "" if age is None else f", oldest {_seconds(age)} old"
            print(f"unpublished: {result['unpublished']}{oldest}", file=out)
    elif noun == "budget":
        # An option left out keeps the setting's default (the API's null).
        body = {"tokensPerDay": args.tokens_per_day, "usdPerMonth": args.usd_per_month}
        result = api.call("PUT", f"/admin/api/users/{args.user_id}/budget", json=body)
        if not args.json:
            print(f"{result['userId']} tokens/day {result['tokensPerDay'] or 'unlimited'},"
                  f" USD/month {result['usdPerMonth'] or 'unlimited'}", file=out)  # fmt: skip
    elif noun == "usage":
        result = api.call("GET", "/admin/api/usage", params={"days": args.days})
        if not args.json:
            _usage(out, result)
    else:
        result = api.call("GET", "/admin/api/audit", params={"limit": args.limit})
        if not args.json:
            rows = [
                (a["at"], a["actor"], a["action"], a["target"], a["count"]) for a in result["items"]
            ]
            _table(out, rows, ("AT", "OPERATOR", "ACTION", "TARGET", "COUNT"))
    if args.json:
        print(json.dumps(result, indent=2), file=out)
    if incomplete:
        raise Failure(incomplete, EXIT_FAILED)


def run(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    args = build_parser().parse_args(argv)  # usage errors exit 2 here
    if not args.token:
        print(f"{PROG}: no operator token: pass --token or set SAN_ADMIN_TOKEN", file=err)
        return EXIT_USAGE
    api = Api(args.url, args.token, args.timeout)
    try:
        execute(args, api, out)
    except Failure as exc:
        print(f"{PROG}: {exc}", file=err)
        return exc.code
    finally:
        api.close()
    return EXIT_OK


def main() -> None:
    raise SystemExit(run())


if __name__ == "__main__":
    main()
