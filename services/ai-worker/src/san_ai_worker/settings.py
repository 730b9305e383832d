from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from san_common.crypto import resolve_keys
from san_common.settings import ServiceSettings


class AiWorkerSettings(ServiceSettings):
    service_name: str = "ai-worker"
    ai_provider: Literal["openai", "local"] = "local"
    ai_base_url: str = "https://api.openai.com/v1"
    ai_api_key: str = ""
    ai_chat_model: str = "gpt-4o-mini"
    ai_embedding_model: str = "text-embedding-3-small"
    ai_timeout_seconds: float = Field(default=60.0, gt=0)
    worker_prefetch: int = Field(default=10, ge=1, le=1000)
    worker_max_tries: int = Field(default=3, ge=1, le=20)
    worker_backoff_seconds: float = Field(default=1.0, ge=0)
    worker_lease_seconds: float = Field(default=300.0, gt=0)
    worker_drain_seconds: float = Field(default=30.0, ge=0)
    # GITHUB_STAR_RECOMMENDATION reads the user's stars with their stored token
    github_api_url: str = "https://api.github.com"
    github_timeout_seconds: float = Field(default=30.0, gt=0)
    token_encryption_keys: str = Field(default="", repr=False)

    @model_validator(mode="after")
    def _key_for_openai_in_production(self) -> AiWorkerSettings:
        if self.san_env == "production" and self.ai_provider == "openai" and not self.ai_api_key:
            raise ValueError("AI_API_KEY must be set for AI_PROVIDER=openai in production")
        return self

    @model_validator(mode="after")
    def _token_keys(self) -> AiWorkerSettings:
        resolved = resolve_keys(
            self.token_encryption_keys, san_env=self.san_env, data_dir=self.data_dir
        )
        object.__setattr__(self, "token_encryption_keys", resolved)
        return self
