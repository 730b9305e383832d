"""The port the AI job handlers talk to, and the factory that picks its implementation."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Protocol

import httpx

from san_ai_worker.ai.local import LocalProvider
from san_ai_worker.ai.openai import OpenAICompatibleProvider, ResponseFormat
from san_ai_worker.ai.schemas import (
    CardAnalysis,
    CardInput,
    RecallQuizSet,
    ScrapRefine,
    StarInput,
    StarRecommendations,
    Til,
)
from san_common.quotas import NO_STATIC, Quotas, Static
from san_common.usage import Prices


class AiProvider(Protocol):
    """What the AI jobs need. Failures raise `TransientJobError` or `PermanentJobError`."""

    async def analyze_card(self, content: str) -> CardAnalysis: ...

    async def refine_scrap(self, content: str) -> ScrapRefine: ...

    async def write_til(self, target_date: datetime.date, cards: Sequence[CardInput]) -> Til: ...

    async def make_quizzes(
        self, cards: Sequence[CardInput], quiz_types: Sequence[str]
    ) -> RecallQuizSet: ...

    async def recommend_stars(
        self, stars: Sequence[StarInput], interests: Sequence[str]
    ) -> StarRecommendations: ...

    async def embed(self, text: str) -> list[float]:
        """Always exactly `EMBEDDING_DIMENSIONS` (1536) floats."""
        ...

    async def aclose(self) -> None: ...


def build_provider(
    provider: str,
    *,
    base_url: str = "https://api.openai.com/v1",
    api_key: str | None = None,
    chat_model: str = "gpt-4o-mini",
    embedding_model: str = "text-embedding-3-small",
    timeout_seconds: float = 60.0,
    response_format: ResponseFormat = "json_schema",
    transport: httpx.AsyncBaseTransport | None = None,
    prices: Prices | None = None,
    upstream_quotas: Quotas | None = None,
    quota_static: Static = NO_STATIC,
) -> AiProvider:
    """`"openai"` (any OpenAI-compatible server) or `"local"` (offline, deterministic)."""
    if provider == "openai":
        if not base_url:
            raise ValueError("the openai AI provider needs a base URL")
        return OpenAICompatibleProvider(
            base_url=base_url,
            api_key=api_key,
            chat_model=chat_model,
            embedding_model=embedding_model,
            timeout_seconds=timeout_seconds,
            response_format=response_format,
            transport=transport,
            prices=prices,
            upstream_quotas=upstream_quotas,
            quota_static=quota_static,
        )
    if provider == "local":
        return LocalProvider(prices)
    raise ValueError(f"unknown AI provider {provider!r}, expected 'openai' or 'local'")
