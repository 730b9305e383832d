from __future__ import annotations

from pydantic import Field, model_validator

from san_common.local_secrets import PLACEHOLDERS, local_secret
from san_common.settings import ServiceSettings


class ApiSettings(ServiceSettings):
    service_name: str = "api"
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=0, le=65535)
    auth_jwt_secret: str = ""
    scrap_max_bytes: int = Field(default=100_000, ge=1, description="Normalized scrap size limit")
    request_max_bytes: int = Field(default=1_000_000, ge=1024, description="Any request body")
    similar_cards_threshold: float = Field(default=0.5, ge=0, le=2)
    similar_cards_k: int = Field(default=10, ge=1, le=100)

    @model_validator(mode="after")
    def _auth_secret(self) -> ApiSettings:
        if self.auth_jwt_secret.lower() in PLACEHOLDERS or len(self.auth_jwt_secret) < 32:
            if self.san_env == "production":
                raise ValueError("AUTH_JWT_SECRET must be set to a real secret (≥ 32 chars) in production")
            if not self.auth_jwt_secret:
                object.__setattr__(
                    self, "auth_jwt_secret", local_secret(self.data_dir, "auth_jwt_secret")
                )
        return self
