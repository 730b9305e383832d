"""Settings of every service that calls GitHub with a user's stored token."""

from __future__ import annotations

from pydantic import Field, model_validator

from san_common.crypto import TokenCipher, resolve_keys
from san_common.github.client import GithubClient
from san_common.quotas import Quotas
from san_common.settings import HttpUrl, ServiceSettings


class GithubAccessSettings(ServiceSettings):
    github_api_url: HttpUrl = "https://api.github.com"
    github_timeout_seconds: float = Field(default=30.0, gt=0)
    token_encryption_keys: str = Field(
        default="", repr=False, description="comma-separated, newest first"
    )

    @model_validator(mode="after")
    def _token_keys(self) -> GithubAccessSettings:
        resolved = resolve_keys(
            self.token_encryption_keys, san_env=self.san_env, data_dir=self.data_dir
        )
        object.__setattr__(self, "token_encryption_keys", resolved)
        return self

    def github_client(self, upstream_quotas: Quotas | None = None) -> GithubClient:
        return GithubClient(
            self.github_api_url,
            timeout_seconds=self.github_timeout_seconds,
            upstream_quotas=upstream_quotas,
        )

    def token_cipher(self) -> TokenCipher:
        return TokenCipher.from_setting(self.token_encryption_keys)
