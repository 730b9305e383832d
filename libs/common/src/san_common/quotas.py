"""Upstream quotas shared by every worker of a deployment (docs/architecture.md, "Upstream
quotas").

One budget per upstream key (an AI base URL and model; a GitHub token), kept in
PostgreSQL (`upstream_quotas`) so that every worker process spends the same one. A client
reserves a request (and its estimated tokens) before each call and settles it with the
answer's rate-limit headers and reported usage after. A call the budget has no room for
is never sent: `reserve` raises `QuotaWait`, a wait until the reset that spends no try and
holds no worker slot (the job waits PENDING in PostgreSQL, its next message due then).

What is left is learned from the answers; before the first one, from static settings
(requests and tokens per window), and with neither, no limit until an answer or a 429
says one (an upstream that sends no headers is not held back). What the headers say is
lowered by the calls still in flight, which the upstream had not counted yet when it
answered.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from san_common import outages
from san_common.errors import SystemWait, is_connection_loss

log = logging.getLogger(__name__)

WINDOW_SECONDS = 60.0  # the static settings are per minute
# How long a probe (the one call of a key whose budget is unknown) may take before another
# may go; also how long a crashed worker's reservation can hold a slot of an unknown budget.
PROBE_SECONDS = 30.0
# How soon a job refused while a probe is out looks again.
PROBE_WAIT_SECONDS = 1.0


class QuotaWait(SystemWait):
    """The upstream's budget is spent until its reset: the job waits that long, however
    long, spending no try (the call was never sent). `key` is the upstream's."""

    waiting_for = "upstream-quota"


@dataclass(frozen=True)
class Static:
    """Limits per window to assume when the upstream sends no headers (None: unknown)."""

    requests: int | None = None
    tokens: int | None = None


NO_STATIC = Static()


@dataclass(frozen=True)
class Answer:
    """What one answer said about the budget (None: it did not say)."""

    requests_remaining: int | None = None
    requests_reset: float | None = None  # seconds from now
    requests_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset: float | None = None
    tokens_limit: int | None = None
    retry_after: float | None = None  # a 429's: nothing is left until then
    used_tokens: int | None = None  # what the call cost, from the answer's usage


# $1 key, $2 estimated tokens, $3 window (s), $4 probe (s), $5 probe wait (s).
# A window that ended refills to the limit (an unknown limit stays unknown: probe again),
# and forgets reservations a crashed worker never settled.
_RESERVE = """
WITH cur AS (
    SELECT q.key, r.ended AS r_ended, t.ended AS t_ended,
        CASE WHEN r.ended THEN q.requests_limit ELSE q.requests_remaining END AS rr,
        CASE WHEN r.ended THEN
            CASE WHEN q.requests_limit IS NULL THEN NULL
                 ELSE now() + make_interval(secs => $3) END
            ELSE q.requests_reset_at END AS rr_at,
        CASE WHEN t.ended THEN q.tokens_limit ELSE q.tokens_remaining END AS tr,
        CASE WHEN t.ended THEN
            CASE WHEN q.tokens_limit IS NULL THEN NULL
                 ELSE now() + make_interval(secs => $3) END
            ELSE q.tokens_reset_at END AS tr_at,
        q.tokens_limit,
        CASE WHEN r.ended THEN 0 ELSE q.in_flight END AS inf,
        CASE WHEN r.ended THEN 0 ELSE q.in_flight_tokens END AS inft
    FROM upstream_quotas AS q,
        LATERAL (SELECT q.requests_reset_at IS NULL OR q.requests_reset_at <= now() AS ended) r,
        LATERAL (SELECT q.tokens_reset_at IS NULL OR q.tokens_reset_at <= now() AS ended) t
    WHERE q.key = $1
    FOR UPDATE OF q
), decided AS (
    SELECT cur.*,
        -- an unknown request budget holds nothing back: an upstream that sends no headers
        -- meters nothing we can see, and serialising its calls would starve every worker
        rr IS NULL OR rr >= 1 AS req_ok,
        -- a call estimated above the whole window still goes once the window is full
        tr IS NULL OR tr >= LEAST($2, coalesce(tokens_limit, $2)) AS tok_ok
    FROM cur
), kept AS (
    UPDATE upstream_quotas AS q
    SET requests_remaining = CASE WHEN req_ok AND tok_ok THEN rr - 1 ELSE rr END,
        requests_reset_at = CASE WHEN req_ok AND tok_ok AND rr IS NULL
            THEN now() + make_interval(secs => $4) ELSE rr_at END,
        tokens_remaining = CASE WHEN req_ok AND tok_ok THEN tr - $2 ELSE tr END,
        tokens_reset_at = tr_at,
        in_flight = inf + CASE WHEN req_ok AND tok_ok THEN 1 ELSE 0 END,
        in_flight_tokens = inft + CASE WHEN req_ok AND tok_ok THEN $2 ELSE 0 END,
        waits = q.waits + CASE WHEN req_ok AND tok_ok THEN 0 ELSE 1 END,
        updated_at = now()
    FROM decided
    WHERE q.key = decided.key
    RETURNING decided.req_ok AND decided.tok_ok AS admitted,
        greatest(
            -- refused while a probe is out: look again soon, not at the probe's deadline
            CASE WHEN NOT decided.req_ok THEN CASE WHEN decided.rr IS NULL THEN $5
                ELSE coalesce(extract(epoch FROM decided.rr_at - now()), $5) END END,
            -- refused on tokens that calls in flight only reserved (their estimates are
            -- settled with what they cost): look again soon, else at the reset
            CASE WHEN NOT decided.tok_ok THEN CASE WHEN decided.tr + decided.inft >= $2 THEN $5
                ELSE extract(epoch FROM decided.tr_at - now()) END END
        )::float8 AS wait
)
SELECT admitted, wait FROM kept
"""

_SEED = """
INSERT INTO upstream_quotas (key, requests_limit, tokens_limit) VALUES ($1, $2, $3)
ON CONFLICT (key) DO NOTHING
"""

# $1 key, $2 the call's estimated tokens, $3 used tokens, $4 requests remaining, $5 its
# reset (s), $6 requests limit, $7 tokens remaining, $8 its reset (s), $9 tokens limit,
# $10 retry-after (s). A header whose reset is later than the one kept starts a new window:
# it is taken as said; within the window, the lower of the two counts.
_SETTLE = """
WITH cur AS (
    SELECT key, greatest(in_flight - 1, 0) AS inf, greatest(in_flight_tokens - $2, 0) AS inft
    FROM upstream_quotas WHERE key = $1 FOR UPDATE
)
UPDATE upstream_quotas AS q
SET in_flight = cur.inf,
    in_flight_tokens = cur.inft,
    requests_limit = coalesce($6, q.requests_limit),
    tokens_limit = coalesce($9, q.tokens_limit),
    requests_remaining = CASE
        WHEN $10::float8 IS NOT NULL THEN 0
        WHEN $4::int IS NULL THEN q.requests_remaining
        WHEN q.requests_reset_at IS NULL OR q.requests_remaining IS NULL
            OR now() + make_interval(secs => $5) > q.requests_reset_at + interval '1 second'
            THEN greatest($4 - cur.inf, 0)
        ELSE least(q.requests_remaining, greatest($4 - cur.inf, 0))
    END,
    requests_reset_at = CASE
        WHEN $10::float8 IS NOT NULL THEN greatest(
            now() + make_interval(secs => $10),
            CASE WHEN $5::float8 IS NOT NULL AND $4 = 0 THEN now() + make_interval(secs => $5) END)
        WHEN $4::int IS NOT NULL AND $5::float8 IS NOT NULL THEN now() + make_interval(secs => $5)
        ELSE q.requests_reset_at
    END,
    tokens_remaining = CASE
        WHEN $7::bigint IS NOT NULL AND (
            q.tokens_reset_at IS NULL OR q.tokens_remaining IS NULL
            OR now() + make_interval(secs => coalesce($8, 0))
                > q.tokens_reset_at + interval '1 second'
        ) THEN greatest($7 - cur.inft, 0)
        WHEN $7::bigint IS NOT NULL THEN least(q.tokens_remaining, greatest($7 - cur.inft, 0))
        -- no header: the estimate is settled with what the answer reports it cost
        ELSE q.tokens_remaining + $2 - coalesce($3, $2)
    END,
    tokens_reset_at = CASE
        WHEN $7::bigint IS NOT NULL AND $8::float8 IS NOT NULL
            THEN now() + make_interval(secs => $8)
        ELSE q.tokens_reset_at
    END,
    updated_at = now()
FROM cur
WHERE q.key = cur.key
"""


@dataclass
class Ticket:
    """One reserved call; `answered` records what its answer said, settled on exit."""

    answer: Answer | None = None
    estimate: int = 0

    def answered(self, answer: Answer) -> None:
        self.answer = answer


class UpstreamQuotas:
    """The budgets of one deployment's upstreams, in its database."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        window_seconds: float = WINDOW_SECONDS,
        probe_seconds: float = PROBE_SECONDS,
    ) -> None:
        self._engine = engine
        self._window = window_seconds
        self._probe = probe_seconds

    @asynccontextmanager
    async def call(
        self, key: str, tokens: int = 0, static: Static = NO_STATIC
    ) -> AsyncIterator[Ticket]:
        """Reserve one call of `key` costing about `tokens`, or raise `QuotaWait`; settle it
        on exit with what `Ticket.answered` recorded (nothing: the call got no answer, and
        what it cost stays spent). With the database unreachable the call goes unmetered,
        as with quotas off, and nothing is settled."""
        ticket = Ticket(estimate=tokens)
        if not await self.reserve(key, tokens, static):
            yield ticket
            return
        try:
            yield ticket
        finally:
            await self.settle(key, tokens, ticket.answer)

    async def reserve(self, key: str, tokens: int, static: Static) -> bool:
        """True once reserved; `QuotaWait` when the budget has no room. False when the
        database is unreachable: the call goes unmetered rather than fail the job's try —
        an answer the job already holds (a card's chat call before its embedding) would be
        asked for again by the next try, and the worker holds a result through the outage
        (docs/reliability.md, "Held results"); the upstream's own 429s still pace it."""
        try:
            async with self._engine.begin() as connection:
                await connection.exec_driver_sql(_SEED, (key, static.requests, static.tokens))
                row = (
                    await connection.exec_driver_sql(
                        _RESERVE, (key, tokens, self._window, self._probe, PROBE_WAIT_SECONDS)
                    )
                ).one()
        except Exception as exc:
            if not is_connection_loss(exc):
                raise
            outages.DATABASE.lost(exc, "reserving an upstream quota")
            return False
        if not row.admitted:
            wait = max(0.0, float(row.wait or PROBE_WAIT_SECONDS))
            raise QuotaWait(
                f"upstream quota of {key} is spent; next call in {wait:.1f}s",
                retry_after=wait,
                key=key,
            )
        return True

    async def settle(self, key: str, estimate: int, answer: Answer | None) -> None:
        said = answer or Answer()
        try:
            async with self._engine.begin() as connection:
                await connection.exec_driver_sql(
                    _SETTLE,
                    (
                        key,
                        estimate,
                        said.used_tokens,
                        said.requests_remaining,
                        said.requests_reset,
                        said.requests_limit,
                        said.tokens_remaining,
                        said.tokens_reset,
                        said.tokens_limit,
                        said.retry_after,
                    ),
                )
        except Exception as exc:
            # The call happened and its result counts; a budget left a call too high heals
            # at the window's end (the reservation is forgotten then). A lost database is
            # the process's one outage, not a traceback per call.
            if is_connection_loss(exc):
                outages.DATABASE.lost(exc, "settling an upstream quota")
            else:
                log.warning("could not settle the upstream quota of %s", key, exc_info=True)


class NoQuotas:
    """Quotas off: every call goes (the 429 answers are the only pacing)."""

    @asynccontextmanager
    async def call(
        self, key: str, tokens: int = 0, static: Static = NO_STATIC
    ) -> AsyncIterator[Ticket]:
        yield Ticket(estimate=tokens)


Quotas = UpstreamQuotas | NoQuotas


def github_key(api_url: str, token: str) -> str:
    """A GitHub budget is its token's (never stored: its digest)."""
    digest = hashlib.sha256(token.encode()).hexdigest()[:24]
    return f"github {api_url} {digest}"


def ai_key(base_url: str, model: str) -> str:
    return f"ai {base_url} {model}"


def github_answer(headers: Mapping[str, str], status: int, now: float | None = None) -> Answer:
    """GitHub's `x-ratelimit-remaining` / `-reset` (epoch seconds) / `-limit`, and a
    403/429's `retry-after`."""
    now = time.time() if now is None else now
    reset = _number(headers.get("x-ratelimit-reset"))
    return Answer(
        requests_remaining=_integer(headers.get("x-ratelimit-remaining")),
        requests_reset=None if reset is None else max(0.0, reset - now),
        requests_limit=_integer(headers.get("x-ratelimit-limit")),
        retry_after=retry_after(headers, now) if status in (403, 429) else None,
    )


def openai_answer(headers: Mapping[str, str], status: int, used_tokens: int | None) -> Answer:
    """OpenAI's `x-ratelimit-{remaining,reset,limit}-{requests,tokens}` (resets as
    durations: `1s`, `6m0s`, `20ms`) and a 429's `retry-after`."""
    return Answer(
        requests_remaining=_integer(headers.get("x-ratelimit-remaining-requests")),
        requests_reset=duration(headers.get("x-ratelimit-reset-requests")),
        requests_limit=_integer(headers.get("x-ratelimit-limit-requests")),
        tokens_remaining=_integer(headers.get("x-ratelimit-remaining-tokens")),
        tokens_reset=duration(headers.get("x-ratelimit-reset-tokens")),
        tokens_limit=_integer(headers.get("x-ratelimit-limit-tokens")),
        retry_after=(retry_after(headers, time.time()) or 1.0) if status == 429 else None,
        used_tokens=used_tokens,
    )


# What an answer may add to its prompt, before the answer says what it cost (settled then).
COMPLETION_ALLOWANCE = 256
_CHARS_PER_TOKEN = 4


def estimate_call_tokens(payload: Mapping[str, object]) -> int:
    """An OpenAI-style request's cost before it is sent: its prompt (messages or input) by
    size, and `max_tokens` or an allowance for the answer."""
    prompt = payload.get("messages") or payload.get("input") or ""
    size = len(json.dumps(prompt)) if not isinstance(prompt, str) else len(prompt)
    answer = payload.get("max_tokens")
    if "input" in payload and "messages" not in payload:
        answer = 0  # an embedding has no answer tokens
    allowance = answer if isinstance(answer, int) else COMPLETION_ALLOWANCE
    return math.ceil(size / _CHARS_PER_TOKEN) + allowance


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str | None) -> float | None:
    """`1m30.5s`, `20ms`, `6m0s` or plain seconds → seconds; None when unreadable."""
    if not text or not text.strip():
        return None
    text = text.strip()
    plain = _number(text)
    if plain is not None:
        return max(0.0, plain)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """`retry-after` in seconds or as an HTTP date; None when absent or unreadable."""
    text = (headers.get("retry-after") or "").strip()
    if not text:
        return None
    seconds = _number(text)
    if seconds is None:
        try:
            seconds = email.utils.parsedate_to_datetime(text).timestamp() - now
        except (TypeError, ValueError):
            return None
    return max(0.0, seconds)


def _number(text: str | None) -> float | None:
    try:
        value = float(text or "")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _integer(text: str | None) -> int | None:
    value = _number(text)
    return None if value is None else max(0, int(value))
