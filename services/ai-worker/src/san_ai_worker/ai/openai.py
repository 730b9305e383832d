"""`OpenAICompatibleProvider`: JSON-schema chat completions and embeddings over HTTP
(docs/reference/job-rules.md §8)."""

from __future__ import annotations

import datetime
import functools
import json
import math
import time
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from san_ai_worker.ai.schemas import (
    CardAnalysis,
    CardInput,
    RecallQuizSet,
    ScrapRefine,
    StarInput,
    StarRecommendations,
    Til,
    check_quiz_types,
)
from san_common import quotas, usage
from san_common.errors import JobFailure, PermanentJobError, TransientJobError, redact
from san_common.models.base import EMBEDDING_DIMENSIONS
from san_common.usage import Prices, estimate_tokens

AnswerT = TypeVar("AnswerT", bound=BaseModel)
ResponseFormat = Literal["json_schema", "json_object"]
# What a server without strict structured output says in its 400, and what to do about it.
_NO_JSON_SCHEMA = ("response_format", "json_schema", "structured output")
_JSON_SCHEMA_HINT = (
    " (the server may not support strict json_schema output: set AI_RESPONSE_FORMAT=json_object)"
)

_SYSTEM_PROMPTS = {
    "card_analysis": (
        "You turn a text the user saved into a knowledge card. Answer in the language of the "
        "text. title: at most 80 characters. summary: 2 to 3 sentences. tags: up to 5 short "
        "lowercase keywords. category: one broad lowercase topic such as programming, database, "
        "devops, ai, web, science or general."
    ),
    "scrap_refine": (
        "Rewrite the text the user saved into clean, readable text in its original language. "
        "Keep every piece of information; fix whitespace, broken lines and obvious typos. "
        "Put the result in refinedContent, without commentary."
    ),
    "til": (
        "Write a 'Today I Learned' markdown document for the given date from the user's "
        "knowledge cards: a top heading with the date, one section per card, concise. "
        "title: one line naming the day's main topic."
    ),
    "recall_quiz": (
        "Write recall quizzes from the user's knowledge cards, only of the types listed in "
        "quiz_types, at least one per type, at most 10 in all. OX: a statement whose answer is "
        "O (true) or X (false). SHORT_ANSWER: a question answered by a word or short phrase. "
        "explanation: why the answer is right."
    ),
    "star_recommendation": (
        "From the user's starred GitHub repositories, pick up to 10 that help with what the user "
        "is learning (interests). repoFullName must be one of the listed repo values exactly. "
        "reason: one sentence. score: relevance from 0 to 1."
    ),
}


class OpenAICompatibleProvider:
    """Any OpenAI-compatible server. Errors are `TransientJobError` / `PermanentJobError`."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        chat_model: str,
        embedding_model: str,
        timeout_seconds: float,
        response_format: ResponseFormat = "json_schema",
        transport: httpx.AsyncBaseTransport | None = None,
        prices: Prices | None = None,
        upstream_quotas: quotas.Quotas | None = None,
        quota_static: quotas.Static = quotas.NO_STATIC,
    ) -> None:
        self._api_key = api_key or ""
        self._base_url = base_url
        self._quotas = upstream_quotas or quotas.NoQuotas()
        self._quota_static = quota_static
        self._prices = prices or Prices()
        self._response_format = response_format
        self._chat_model = chat_model
        self._embedding_model = embedding_model
        self._client = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
            timeout=timeout_seconds,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def analyze_card(self, content: str) -> CardAnalysis:
        return await self._ask("card_analysis", CardAnalysis, content)

    async def refine_scrap(self, content: str) -> ScrapRefine:
        return await self._ask("scrap_refine", ScrapRefine, content)

    async def write_til(self, target_date: datetime.date, cards: Sequence[CardInput]) -> Til:
        prompt = f"date: {target_date.isoformat()}\n\n{_render_cards(cards)}"
        return await self._ask("til", Til, prompt)

    async def make_quizzes(
        self, cards: Sequence[CardInput], quiz_types: Sequence[str]
    ) -> RecallQuizSet:
        requested = check_quiz_types(quiz_types)
        # The fake AI server of the tests reads this line; keep the format.
        prompt = f"quiz_types: {','.join(requested)}\n\n{_render_cards(cards)}"
        answer = await self._ask("recall_quiz", RecallQuizSet, prompt)
        unrequested = sorted({quiz.type for quiz in answer.quizzes} - set(requested))
        if unrequested:
            # The prompt named the types; a model that invents others tends to do so again.
            raise PermanentJobError(
                f"AI answer for recall_quiz has quiz type {', '.join(unrequested)}, "
                f"requested {','.join(requested)}"
            )
        return answer

    async def recommend_stars(
        self, stars: Sequence[StarInput], interests: Sequence[str]
    ) -> StarRecommendations:
        blocks = [f"interests: {', '.join(interests)}"]
        for star in stars:
            # One `repo:` line per star; the fake AI server of the tests reads these.
            lines = [f"repo: {star.full_name}"]
            if star.description:
                lines.append(f"description: {_one_line(star.description)}")
            if star.topics:
                lines.append(f"topics: {', '.join(star.topics)}")
            if star.language:
                lines.append(f"language: {star.language}")
            blocks.append("\n".join(lines))
        answer = await self._ask("star_recommendation", StarRecommendations, "\n\n".join(blocks))
        # Models invent repositories; keep only starred ones, spelled as GitHub spells them.
        known = {star.full_name.lower(): star.full_name for star in stars}
        kept, seen = [], set()
        for rec in answer.recommendations:
            name = known.get(rec.repoFullName.lower())
            if name is not None and name not in seen:
                seen.add(name)
                kept.append(rec.model_copy(update={"repoFullName": name}))
        return StarRecommendations(recommendations=kept)

    async def embed(self, text: str) -> list[float]:
        payload = {
            "model": self._embedding_model,
            "input": text,
            "dimensions": EMBEDDING_DIMENSIONS,
        }
        started = time.monotonic()
        body = await self._post("/embeddings", payload)
        tokens = _usage_count(body, "prompt_tokens")
        self._report(
            self._embedding_model,
            "embedding",
            started,
            embedding=tokens if tokens is not None else estimate_tokens(text),
            estimated=tokens is None,
        )
        try:
            raw = body["data"][0]["embedding"]
        except (KeyError, IndexError, TypeError) as exc:
            raise TransientJobError("AI answer for embeddings misses data[0].embedding") from exc
        return _fit_embedding(raw)

    async def _ask(self, name: str, model: type[AnswerT], prompt: str) -> AnswerT:
        system = _SYSTEM_PROMPTS[name]
        response_format: dict[str, Any]
        if self._response_format == "json_object":
            # JSON mode: the server only promises JSON, so the schema travels in the prompt
            # and the answer is validated below as strictly as a strict schema would be.
            system += (
                f"\n\nAnswer with one JSON object named {name}, matching this JSON schema: "
                + json.dumps(_schema(model), separators=(",", ":"))
            )
            response_format = {"type": "json_object"}
        else:
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": _schema(model), "strict": True},
            }
        payload = {
            "model": self._chat_model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": prompt},
            ],
            "response_format": response_format,
        }
        started = time.monotonic()
        body = await self._post("/chat/completions", payload)
        prompt_tokens = _usage_count(body, "prompt_tokens")
        completion_tokens = _usage_count(body, "completion_tokens")
        self._report(
            self._chat_model,
            "chat",
            started,
            prompt=estimate_tokens(system + prompt) if prompt_tokens is None else prompt_tokens,
            completion=(
                estimate_tokens(_answer_text(body))
                if completion_tokens is None
                else completion_tokens
            ),
            estimated=prompt_tokens is None or completion_tokens is None,
        )
        try:
            message = body["choices"][0]["message"]
            content, refusal = message.get("content"), message.get("refusal")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise TransientJobError(f"AI answer for {name} misses choices[0].message") from exc
        if refusal and not content:
            raise PermanentJobError(f"AI refused {name}: {_excerpt(str(refusal))}")
        if not isinstance(content, str):
            raise TransientJobError(f"AI answer for {name} has no text content")
        try:
            data = json.loads(content)
        except ValueError as exc:
            raise TransientJobError(f"AI answer for {name} is not valid JSON") from exc
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise TransientJobError(_describe_invalid(name, exc)) from exc

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        key = quotas.ai_key(self._base_url, str(payload.get("model")))
        estimate = quotas.estimate_call_tokens(payload)
        async with self._quotas.call(key, estimate, self._quota_static) as ticket:
            response = await self._send(path, payload)
            ticket.answered(
                quotas.openai_answer(response.headers, response.status_code, _total(response))
            )
        if not response.is_success:
            raise self._status_error(path, response)
        try:
            return response.json()
        except ValueError as exc:
            raise TransientJobError(
                f"AI server answered {path} with a body that is not JSON"
            ) from exc

    async def _send(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        try:
            return await self._client.post(path, json=payload)
        except httpx.TimeoutException as exc:
            raise TransientJobError(f"AI server timed out on {path}") from exc
        except httpx.UnsupportedProtocol as exc:
            raise PermanentJobError(f"AI base URL cannot be used for {path}") from exc
        except httpx.TransportError as exc:
            raise TransientJobError(f"AI server unreachable on {path}") from exc

    def _report(
        self,
        model: str,
        call: usage.Call,
        started: float,
        *,
        prompt: int = 0,
        completion: int = 0,
        embedding: int = 0,
        estimated: bool,
    ) -> None:
        """One answered call into the try's usage (a call without an answer is not
        reported: what the server counted for it is unknown)."""
        usage.record(
            usage.AiCall(
                model=model,
                call=call,
                prompt_tokens=prompt,
                completion_tokens=completion,
                embedding_tokens=embedding,
                estimated=estimated,
                latency_ms=round((time.monotonic() - started) * 1000),
                cost_usd=self._prices.cost(model, prompt, completion, embedding),
            )
        )

    def _status_error(self, path: str, response: httpx.Response) -> JobFailure:
        status = response.status_code
        # Some servers echo the key they rejected; the body is redacted before it is quoted.
        detail = redact(_excerpt(response.text), (self._api_key,))
        message = f"AI server answered {status} on {path}" + (f": {detail}" if detail else "")
        if (
            status == 400
            and self._response_format == "json_schema"
            and any(word in detail.lower() for word in _NO_JSON_SCHEMA)
        ):
            message += _JSON_SCHEMA_HINT
        error: JobFailure
        if status == 429:
            error = TransientJobError(message, retry_after=_retry_after(response))
        elif status == 408 or status >= 500:
            error = TransientJobError(message)
        else:
            error = PermanentJobError(message)
        # For the client-facing summary (san_common.errors.summarize): status and call only.
        error.status, error.call = status, f"the AI call {path}"
        return error


@functools.cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def _usage_count(body: Any, name: str) -> int | None:
    """`usage.<name>` of an answer, None when the answer does not say."""
    counts = body.get("usage") if isinstance(body, dict) else None
    value = counts.get(name) if isinstance(counts, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _total(response: httpx.Response) -> int | None:
    """`usage.total_tokens` of an answer, for the upstream quota; None when it does not say."""
    if not response.is_success:
        return None
    try:
        return _usage_count(response.json(), "total_tokens")
    except ValueError:
        return None


def _answer_text(body: Any) -> str:
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


def _render_cards(cards: Sequence[CardInput]) -> str:
    blocks = []
    for number, card in enumerate(cards, start=1):
        lines = [f"card {number}", f"title: {_one_line(card.title)}", f"summary: {card.summary}"]
        if card.tags:
            lines.append(f"tags: {', '.join(card.tags)}")
        if card.category:
            lines.append(f"category: {card.category}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) or "(no cards)"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _excerpt(text: str, limit: int = 300) -> str:
    text = _one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe_invalid(name: str, exc: ValidationError) -> str:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"])
    if error["type"] == "missing":
        return f"AI answer for {name} misses field '{field}'"
    if not field:
        return f"AI answer for {name} does not match its schema: {error['msg']}"
    return f"AI answer for {name} has an invalid field '{field}': {error['msg']}"


def _retry_after(response: httpx.Response) -> float | None:
    try:
        seconds = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None  # absent, or an HTTP date: let the runtime's backoff decide
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _fit_embedding(raw: Any) -> list[float]:
    """Exactly 1536 floats. Any other length fails the job: padding or cutting a vector of
    another model would store an embedding that is not comparable with the others."""
    if not isinstance(raw, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in raw
    ):
        raise TransientJobError("AI answer for embeddings is not a list of numbers")
    if len(raw) != EMBEDDING_DIMENSIONS:
        raise PermanentJobError(
            f"embedding has {len(raw)} dimensions, expected {EMBEDDING_DIMENSIONS} "
            "(configure an embedding model that answers with that many)"
        )
    return [float(v) for v in raw]
