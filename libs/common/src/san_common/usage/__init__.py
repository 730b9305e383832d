"""What AI calls cost (docs/architecture.md, "The usage ledger").

A provider reports each call that answered with `record`; the worker runtime collects the
calls a try makes (`collecting`, a context variable set around `handler.run`) and writes
them to the ledger (`usage.ledger`), whatever becomes of the try: the call was paid for.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from san_common import metrics

Call = Literal["chat", "embedding"]
_MILLION = Decimal(1_000_000)
# Tokens per character of a text whose answer gave no `usage`: the usual rule of thumb
# for English with OpenAI's tokenizers (about four characters a token).
_CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Price:
    """US dollars per 1M tokens: `input` for prompt and embedding tokens."""

    input: Decimal
    output: Decimal = Decimal(0)


@dataclass(frozen=True)
class Prices:
    """The price table (`AI_PRICES`), per model. A model it does not list costs nothing:
    its tokens still count against token budgets."""

    by_model: Mapping[str, Price] = field(default_factory=dict)

    def cost(self, model: str, prompt: int, completion: int, embedding: int) -> Decimal:
        price = self.by_model.get(model)
        if price is None:
            return Decimal(0)
        return ((prompt + embedding) * price.input + completion * price.output) / _MILLION


@dataclass(frozen=True)
class AiCall:
    """One AI call that answered."""

    model: str
    call: Call
    prompt_tokens: int
    completion_tokens: int
    embedding_tokens: int
    estimated: bool
    latency_ms: int
    cost_usd: Decimal

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens + self.embedding_tokens


@dataclass(frozen=True)
class TryUsage:
    """The calls of one try of a job, as its worker collects them."""

    job_id: uuid.UUID
    try_no: int
    user_id: uuid.UUID
    job_type: str
    calls: list[AiCall] = field(default_factory=list)


_current: ContextVar[TryUsage | None] = ContextVar("san_usage_try", default=None)


@contextlib.contextmanager
def collecting(
    job_id: uuid.UUID, try_no: int, user_id: uuid.UUID, job_type: str
) -> Iterator[TryUsage]:
    """The calls `record`ed inside the block (and in tasks it starts) land in the result."""
    collected = TryUsage(job_id, try_no, user_id, job_type)
    token = _current.set(collected)
    try:
        yield collected
    finally:
        _current.reset(token)


def record(call: AiCall) -> None:
    """A provider's report of one answered call. Outside a try (a check, a test of the
    provider) it is only counted in the metrics."""
    collected = _current.get()
    job_type = collected.job_type if collected is not None else ""
    metrics.AI_TOKENS.labels(call.model, job_type, "prompt").inc(call.prompt_tokens)
    metrics.AI_TOKENS.labels(call.model, job_type, "completion").inc(call.completion_tokens)
    metrics.AI_TOKENS.labels(call.model, job_type, "embedding").inc(call.embedding_tokens)
    metrics.AI_COST.labels(call.model, job_type).inc(float(call.cost_usd))
    if collected is not None:
        collected.calls.append(call)


def estimate_tokens(text: str) -> int:
    """Tokens of `text` when the answer does not say (marked `estimated` in the ledger)."""
    return max(1, math.ceil(len(text) / _CHARS_PER_TOKEN)) if text else 0
