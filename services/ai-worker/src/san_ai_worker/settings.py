from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from san_common.github.settings import GithubAccessSettings
from san_common.settings import HttpUrl
from san_common.worker.settings import WorkerSettings


class AiWorkerSettings(WorkerSettings, GithubAccessSettings):
    """GithubAccessSettings: GITHUB_STAR_RECOMMENDATION reads stars with the stored token."""

    reported_prefixes: ClassVar[tuple[str, ...]] = ("AI_",)

    service_name: str = "ai-worker"
    ai_provider: Literal["openai", "local"] = "local"
    ai_base_url: HttpUrl = "https://api.openai.com/v1"
    ai_api_key: str = Field(default="", repr=False)
    ai_chat_model: str = "gpt-4o-mini"
    ai_embedding_model: str = "text-embedding-3-small"
    ai_timeout_seconds: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _key_for_openai_in_production(self) -> AiWorkerSettings:
        if self.san_env == "production" and self.ai_provider == "openai" and not self.ai_api_key:
            raise ValueError("AI_API_KEY must be set for AI_PROVIDER=openai in production")
        return self
