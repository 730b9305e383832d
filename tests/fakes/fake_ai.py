"""A fake OpenAI-compatible AI server on loopback, with fault injection.

    with FakeAiServer() as ai:
        provider = build_provider("openai", base_url=ai.base_url, ...)
        ai.set_fault("http_500", times=2)

It really listens on 127.0.0.1 (a free port) in a background thread, so the real HTTP client
code runs. Answers are canned but depend on the request: `recall_quiz` reads the
`quiz_types: OX,SHORT_ANSWER` line of the user message, `star_recommendation` the
`repo: owner/name` lines, `til` the `date:` and `title:` lines.

`enforce_limits` makes it an upstream with a quota, as OpenAI's: requests and tokens per
window and model, OpenAI's `x-ratelimit-*` headers on every answer, 429 with `retry-after`
past either limit.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import select
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal

from tests.fakes.loopback import LoopbackHTTPServer, LoopbackServer

Fault = Literal[
    "http_500",
    "timeout",
    "invalid_json",
    "missing_field",
    "wrong_dimension",
    "http_429",
    "http_400",
    "hang",  # hold the request `delay_seconds`, noticing when the client closes it
]
ChatOverride = Callable[[str, dict[str, Any]], dict[str, Any]]

WRONG_DIMENSIONS = 2048


class FakeAiServer(LoopbackServer):
    """OpenAI-compatible `POST /v1/chat/completions` and `POST /v1/embeddings`."""

    def __init__(self) -> None:
        self.delay_seconds = 5.0  # how long the "timeout" fault keeps a request waiting
        self.retry_after = "7"  # `Retry-After` header of the "http_429" fault
        self.error_detail = ""  # appended to the error bodies of "http_500" and "http_400"
        self.embedding_dimensions = 1536  # the model's native size: at most this many are sent
        self.chat_override: ChatOverride | None = None
        # False: like servers with JSON mode only, a json_schema response_format is a 400
        self.json_schema_supported = True
        # False: answers carry no `usage` (the worker must estimate and say so)
        self.usage_supported = True
        self._usage: list[tuple[str, dict[str, int]]] = []
        self._closed_early = 0  # "hang" requests whose client closed the connection
        self._lock = threading.Lock()
        self._fault: Fault | None = None
        self._fault_times: int | None = None
        self._fault_path: str | None = None
        self._requests: list[tuple[str, dict[str, Any]]] = []
        self._headers: list[dict[str, str]] = []
        self._limits: tuple[int, int, float] | None = None  # requests, tokens, window (s)
        self._windows: dict[str, list[float]] = {}  # model → [start, requests, tokens]
        self.answered_at: list[float] = []  # time.monotonic() of each 200 within the limits
        self.limited = 0  # 429s sent because a limit was spent
        self.window_starts: list[float] = []  # time.monotonic() each window opened
        super().__init__(_Handler)

    def enforce_limits(self, *, requests: int, tokens: int, window: float) -> None:
        """At most `requests` calls and `tokens` tokens (as each answer's usage counts them)
        per model in each `window` seconds, the window starting at its first call."""
        with self._lock:
            self._limits = (requests, tokens, window)
            self._windows.clear()

    def _admit(self, model: str) -> tuple[bool, dict[str, str]]:
        """Whether a call of `model` is within the limits (counted if so), and the headers."""
        if self._limits is None:
            return True, {}
        requests, tokens, window = self._limits
        with self._lock:
            now = time.monotonic()
            state = self._windows.get(model)
            if state is None or now >= state[0] + window:
                state = self._windows[model] = [now, 0.0, 0.0]
                self.window_starts.append(now)
            admitted = state[1] < requests and state[2] < tokens
            if admitted:
                state[1] += 1
            else:
                self.limited += 1
            left = state[0] + window - now
            return admitted, self._limit_headers(state, left)

    def _charge(self, model: str, used: int) -> dict[str, str]:
        """Count an answered call's tokens; the headers after it."""
        if self._limits is None:
            return {}
        with self._lock:
            state = self._windows[model]
            state[2] += used
            self.answered_at.append(time.monotonic())
            return self._limit_headers(state, state[0] + self._limits[2] - time.monotonic())

    def _limit_headers(self, state: list[float], left: float) -> dict[str, str]:
        assert self._limits is not None
        requests, tokens, _ = self._limits
        reset = f"{max(left, 0.0):.3f}s"
        return {
            "x-ratelimit-limit-requests": str(requests),
            "x-ratelimit-remaining-requests": str(max(0, requests - int(state[1]))),
            "x-ratelimit-reset-requests": reset,
            "x-ratelimit-limit-tokens": str(tokens),
            "x-ratelimit-remaining-tokens": str(max(0, tokens - int(state[2]))),
            "x-ratelimit-reset-tokens": reset,
        }

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    # -- faults and records ------------------------------------------------------------------

    @property
    def fault(self) -> Fault | None:
        with self._lock:
            return self._fault

    @fault.setter
    def fault(self, fault: Fault | None) -> None:
        self.set_fault(fault)

    def set_fault(
        self, fault: Fault | None, *, times: int | None = None, path: str | None = None
    ) -> None:
        """Inject `fault` into every request (of `path` only, e.g. "/v1/embeddings", when
        given), or only into the next `times` it applies to."""
        with self._lock:
            self._fault, self._fault_times, self._fault_path = fault, times, path

    @property
    def requests(self) -> list[tuple[str, dict[str, Any]]]:
        """`(path, json body)` of every request received, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """Headers (lowercased names) of every request received, oldest first."""
        with self._lock:
            return list(self._headers)

    @property
    def reported_usage(self) -> dict[str, int]:
        """Totals of the `usage` this server reported: prompt and completion tokens of chat
        answers, prompt tokens of embedding answers."""
        with self._lock:
            reported = list(self._usage)
        totals = {"prompt": 0, "completion": 0, "embedding": 0}
        for path, usage in reported:
            if path == "/v1/embeddings":
                totals["embedding"] += usage["prompt_tokens"]
            else:
                totals["prompt"] += usage["prompt_tokens"]
                totals["completion"] += usage["completion_tokens"]
        return totals

    def forget(self) -> None:
        """Forget the usage reported and the connections closed so far (the server is
        shared by a test session; a test counts from here)."""
        with self._lock:
            self._usage.clear()
            self._closed_early = 0

    @property
    def closed_early(self) -> int:
        """How many "hang" requests saw their client close the connection while held."""
        with self._lock:
            return self._closed_early

    def chat_calls(self, schema: str | None = None) -> int:
        """Chat requests received (of one answer schema, when given)."""
        return sum(
            1
            for path, body in self.requests
            if path == "/v1/chat/completions" and (schema is None or _schema_name(body) == schema)
        )

    def _usage_of(self, path: str, usage: dict[str, int]) -> dict[str, int] | None:
        if not self.usage_supported:
            return None
        with self._lock:
            self._usage.append((path, usage))
        return usage

    def _hold(self, connection: Any) -> None:
        """Wait `delay_seconds`, or until the client closes the connection (counted)."""
        deadline = time.monotonic() + self.delay_seconds
        while time.monotonic() < deadline and not self._stopping.is_set():
            readable, _, _ = select.select([connection], [], [], 0.05)
            if readable and not connection.recv(1, socket.MSG_PEEK):
                with self._lock:
                    self._closed_early += 1
                return

    @staticmethod
    def embedding_for(text: str, dimensions: int) -> list[float]:
        """The vector this server answers for `text`: deterministic, unit length."""
        rng = random.Random(hashlib.sha256(text.encode()).digest())
        vector = [rng.uniform(-1.0, 1.0) for _ in range(dimensions)]
        norm = math.sqrt(sum(v * v for v in vector))
        return [v / norm for v in vector]

    def _record(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        with self._lock:
            self._requests.append((path, body))
            self._headers.append(headers)

    def _take_fault(self, path: str) -> Fault | None:
        """The fault for this request, counting it down if it is limited."""
        with self._lock:
            fault = self._fault
            if fault is None or (fault == "wrong_dimension" and path != "/v1/embeddings"):
                return None
            if self._fault_path is not None and path != self._fault_path:
                return None
            if self._fault_times is not None:
                self._fault_times -= 1
                if self._fault_times <= 0:
                    self._fault, self._fault_times = None, None
            return fault

    def _wait_or_stop(self) -> None:
        self._stopping.wait(self.delay_seconds)

    # -- answers ---------------------------------------------------------------------------

    def _chat_answer(self, body: dict[str, Any]) -> dict[str, Any] | None:
        name = _schema_name(body)
        override = self.chat_override
        if override is not None:
            return override(name, body)
        prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
        answer = _CANNED.get(name)
        return None if answer is None else answer(prompt)


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackHTTPServer[FakeAiServer]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the test output clean

    def do_POST(self) -> None:
        fake = self.server.fake
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        except ValueError:
            self._send_json(400, _error("request body is not JSON"))
            return
        path = self.path
        fake._record(path, body, {k.lower(): v for k, v in self.headers.items()})
        if path not in ("/v1/chat/completions", "/v1/embeddings"):
            self._send_json(404, _error(f"no route {path}"))
            return
        admitted, limit_headers = fake._admit(str(body.get("model", "")))
        if not admitted:
            retry_after = limit_headers["x-ratelimit-reset-requests"].removesuffix("s")
            self._send_json(
                429,
                _error("rate limit reached for requests or tokens"),
                {**limit_headers, "retry-after": retry_after},
            )
            return
        fault = fake._take_fault(path)
        if fault == "hang":
            fake._hold(self.connection)
            self.close_connection = True
            return
        if fault == "timeout":
            fake._wait_or_stop()
            self.close_connection = True
            return  # no answer at all
        if fault == "http_500":
            self._send_json(500, _error("the server had an error" + fake.error_detail))
        elif fault == "http_429":
            headers = {"retry-after": fake.retry_after}
            self._send_json(429, _error("rate limit reached"), headers)
        elif fault == "http_400":
            # Like some real servers, echo the credentials seen, so tests prove they get redacted.
            seen = self.headers.get("authorization", "")
            detail = f"invalid request (authorization: {seen}){fake.error_detail}"
            self._send_json(400, _error(detail))
        elif path == "/v1/chat/completions":
            self._chat(body, fault)
        else:
            self._embeddings(body, fault)

    def _chat(self, body: dict[str, Any], fault: Fault | None) -> None:
        kind = body["response_format"]["type"]
        if kind == "json_schema" and not self.server.fake.json_schema_supported:
            self._send_json(400, _error("response_format type json_schema is not supported"))
            return
        answer = self.server.fake._chat_answer(body)
        if answer is None:
            self._send_json(400, _error("unknown response_format.json_schema.name"))
            return
        if fault == "missing_field":
            required = [*answer]
            if kind == "json_schema":
                required = (
                    body["response_format"]["json_schema"]["schema"].get("required") or required
                )
            answer = {k: v for k, v in answer.items() if k != required[0]}
        content = "Sure! Here is the JSON you asked for." if fault == "invalid_json" else None
        text = content or json.dumps(answer, ensure_ascii=False)
        # Tokens that depend on the request and the answer, so totals prove the ledger adds
        # what each answer said, not a constant.
        prompt_chars = sum(len(str(m.get("content", ""))) for m in body["messages"])
        usage = self.server.fake._usage_of(
            "/v1/chat/completions",
            {"prompt_tokens": prompt_chars // 3 + 11, "completion_tokens": len(text) // 3 + 5},
        )
        reply: dict[str, Any] = {
            "id": f"chatcmpl-fake-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
        }
        if usage is not None:
            reply["usage"] = {**usage, "total_tokens": sum(usage.values())}
        total = sum(usage.values()) if usage is not None else 0
        self._send_json(200, reply, self.server.fake._charge(body.get("model", ""), total))

    def _embeddings(self, body: dict[str, Any], fault: Fault | None) -> None:
        if fault == "invalid_json":
            self._send(200, b"<html>not json</html>", "text/html")
            return
        if fault == "missing_field":
            self._send_json(200, {"object": "list", "data": [{"index": 0}]})
            return
        fake = self.server.fake
        requested = int(body.get("dimensions") or fake.embedding_dimensions)
        size = (
            WRONG_DIMENSIONS
            if fault == "wrong_dimension"
            else min(requested, fake.embedding_dimensions)
        )
        text = str(body.get("input", ""))
        vector = FakeAiServer.embedding_for(text, size)
        reply: dict[str, Any] = {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "model": body.get("model", ""),
        }
        usage = fake._usage_of("/v1/embeddings", {"prompt_tokens": len(text) // 3 + 2})
        if usage is not None:
            reply["usage"] = {**usage, "total_tokens": usage["prompt_tokens"]}
        self._send_json(200, reply)

    def _send_json(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _send(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _lines(prompt: str, key: str) -> list[str]:
    prefix = f"{key}:"
    return [line[len(prefix) :].strip() for line in prompt.splitlines() if line.startswith(prefix)]


def _card_analysis(prompt: str) -> dict[str, Any]:
    first_line = next((line.strip() for line in prompt.splitlines() if line.strip()), "untitled")
    words = sorted({w.lower() for w in re.findall(r"[^\W\d_]{4,}", prompt)})
    return {
        "title": first_line[:80],
        "summary": " ".join(prompt.split())[:300] or "empty",
        "tags": words[:3],
        "category": "general",
    }


def _scrap_refine(prompt: str) -> dict[str, Any]:
    return {"refinedContent": " ".join(prompt.split()) or "empty"}


def _til(prompt: str) -> dict[str, Any]:
    day = next(iter(_lines(prompt, "date")), "unknown-date")
    titles = _lines(prompt, "title")
    sections = "".join(f"\n## {title}\n\nLearned about {title}.\n" for title in titles)
    return {"title": f"TIL {day}", "tilMarkdown": f"# TIL {day}\n{sections}"}


def _recall_quiz(prompt: str) -> dict[str, Any]:
    types = [t.strip() for t in next(iter(_lines(prompt, "quiz_types")), "OX").split(",")]
    titles = _lines(prompt, "title") or ["this topic"]
    quizzes = []
    for title in titles:
        for quiz_type in types:
            if quiz_type == "OX":
                question, answer = f"{title} was studied today.", "O"
            else:
                question, answer = f"Which topic was studied today ({title[:1]}…)?", title
            quizzes.append(
                {"type": quiz_type, "question": question, "answer": answer, "explanation": title}
            )
    return {"quizzes": quizzes[:10]}


def _star_recommendation(prompt: str) -> dict[str, Any]:
    repos = _lines(prompt, "repo")
    return {
        "recommendations": [
            {"repoFullName": repo, "reason": f"{repo} fits your interests.", "score": 1 / (i + 1)}
            for i, repo in enumerate(repos[:10])
        ]
    }


_CANNED: dict[str, Callable[[str], dict[str, Any]]] = {
    "card_analysis": _card_analysis,
    "scrap_refine": _scrap_refine,
    "til": _til,
    "recall_quiz": _recall_quiz,
    "star_recommendation": _star_recommendation,
}


def _schema_name(body: dict[str, Any]) -> str:
    """The answer asked for: json_schema mode names it in `response_format`; JSON mode
    (json_object) only in the system prompt ("… one JSON object named card_analysis …")."""
    response_format = body["response_format"]
    if response_format["type"] == "json_schema":
        return str(response_format["json_schema"]["name"])
    system = next(m["content"] for m in body["messages"] if m["role"] == "system")
    found = re.search(r"JSON object named (\w+)", system)
    return found.group(1) if found else ""
