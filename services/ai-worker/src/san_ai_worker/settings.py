from __future__ import annotations

from decimal import Decimal
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from san_common.github.settings import GithubAccessSettings
from san_common.quotas import Static
from san_common.settings import HttpUrl
from san_common.usage import Price, Prices
from san_common.usage.budgets import BudgetSettings
from san_common.worker.settings import WorkerSettings


class ModelPrice(BaseModel):
    """US dollars per 1M tokens: `input` for prompt and embedding tokens, `output` for
    completion tokens."""

    input: Decimal = Field(ge=0)
    output: Decimal = Field(default=Decimal(0), ge=0)


# The default models' list prices; AI_PRICES replaces the whole table.
DEFAULT_PRICES = {
    "gpt-4o-mini": ModelPrice(input=Decimal("0.15"), output=Decimal("0.60")),
    "text-embedding-3-small": ModelPrice(input=Decimal("0.02")),
}


class AiWorkerSettings(WorkerSettings, GithubAccessSettings, BudgetSettings):
    """GithubAccessSettings: GITHUB_STAR_RECOMMENDATION reads stars with the stored token."""

    reported_prefixes: ClassVar[tuple[str, ...]] = ("AI_",)

    service_name: str = "ai-worker"
    ai_provider: Literal["openai", "local"] = "local"
    ai_base_url: HttpUrl = "https://api.openai.com/v1"
    ai_api_key: str = Field(default="", repr=False)
    ai_chat_model: str = "gpt-4o-mini"
    ai_embedding_model: str = "text-embedding-3-small"
    ai_timeout_seconds: float = Field(default=60.0, gt=0)
    ai_response_format: Literal["json_schema", "json_object"] = Field(
        default="json_schema",
        description="json_object for servers without strict json_schema output (JSON mode; "
        "every answer still validated against its schema)",
    )

    ai_requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="The chat model's request quota when the AI server sends no rate-limit "
        "headers (unset: learned from the first answer)",
    )
    ai_tokens_per_minute: int | None = Field(default=None, ge=1, description="The same, in tokens")

    ai_prices: dict[str, ModelPrice] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES),
        description='JSON: {"model": {"input": usd_per_1m, "output": usd_per_1m}, …}; '
        "a model not listed costs nothing",
    )

    def prices(self) -> Prices:
        return Prices({m: Price(p.input, p.output) for m, p in self.ai_prices.items()})

    def provider_options(self) -> dict[str, Any]:
        """`build_provider`'s keyword arguments from these settings."""
        return {
            "base_url": self.ai_base_url,
            "api_key": self.ai_api_key,
            "chat_model": self.ai_chat_model,
            "embedding_model": self.ai_embedding_model,
            "timeout_seconds": self.ai_timeout_seconds,
            "response_format": self.ai_response_format,
            "prices": self.prices(),
            "quota_static": Static(self.ai_requests_per_minute, self.ai_tokens_per_minute),
        }

    @model_validator(mode="after")
    def _key_for_openai_in_production(self) -> AiWorkerSettings:
        if self.san_env == "production" and self.ai_provider == "openai" and not self.ai_api_key:
            raise ValueError("AI_API_KEY must be set for AI_PROVIDER=openai in production")
        return self
