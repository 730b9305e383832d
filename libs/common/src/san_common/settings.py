"""Settings shared by every service; each service subclasses `ServiceSettings`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field, ValidationError, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_AMQP_URL = "amqp://guest:guest@localhost:5672/"


class ServiceSettings(BaseSettings):
    """Environment-driven settings common to all services (SPEC §8)."""

    model_config = SettingsConfigDict(env_file=None, extra="ignore", frozen=True)

    san_env: Literal["development", "test", "production"] = "development"
    service_name: str = "san"
    database_url: str = Field(
        default="",
        description="postgresql://… URL; empty in a local run: the launcher's embedded one",
    )
    amqp_url: str = DEFAULT_AMQP_URL
    amqp_prefix: str = Field(
        default="san",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Prefix of every exchange and queue name; lets several stacks share one broker",
    )
    data_dir: Path = Path(".data")
    log_format: Literal["json", "console"] = "json"
    log_level: str = "INFO"
    probe_host: str = "127.0.0.1"
    probe_port: int = Field(
        default=0, ge=0, le=65535, description="/healthz, /readyz, /metrics; 0 picks a free port"
    )
    tracing_enabled: bool = Field(
        default=False, description="OpenTelemetry tracing (also on when an OTLP endpoint is set)"
    )
    otel_exporter_otlp_endpoint: str = Field(
        default="", description="OTLP/HTTP collector, e.g. http://otel-collector:4318"
    )

    @model_validator(mode="after")
    def _database_required_in_production(self) -> ServiceSettings:
        if self.san_env == "production" and not self.database_url:
            raise ValueError("DATABASE_URL must be set when SAN_ENV=production")
        return self


S = TypeVar("S", bound=ServiceSettings)


class ConfigurationError(SystemExit):
    """Settings that do not validate: the process stops with a readable message (and exit
    code 2), not a traceback — a deployer reads this line in a crash-looping pod's log."""


def load_settings(cls: type[S]) -> S:
    try:
        return cls()
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        print(f"configuration error ({cls.__name__}): {problems}", file=sys.stderr)
        raise ConfigurationError(2) from None


def _describe(error: ErrorDetails) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    variable = "_".join(str(part) for part in error["loc"]).upper()
    return f"{variable}: {message}" if variable else message
