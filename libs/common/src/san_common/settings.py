"""Settings shared by every service; each service subclasses `ServiceSettings`."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, ClassVar, Literal, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit

from pydantic import AfterValidator, AliasChoices, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_AMQP_URL = "amqp://guest:guest@localhost:5672/"
# Passwords that ship in this repository or in the servers' images (compose's fallback,
# RabbitMQ's guest): fine on a laptop, refused in any URL when SAN_ENV=production.
PLACEHOLDER_PASSWORDS = frozenset(
    {"", "san-local-only", "guest", "postgres", "password", "changeme", "change-me", "secret"}
)


def _url_parts(value: str, example: str) -> SplitResult:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc}); expected {example}") from None
    return parts


def _checked_url(
    schemes: frozenset[str], example: str, *, socket_host: bool = False
) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not value:
            return value  # unset: each setting decides what that means
        parts = _url_parts(value, example)
        if parts.scheme not in schemes:
            raise ValueError(
                f"the scheme must be {' or '.join(sorted(schemes))}, not {parts.scheme or 'none'!r}"
                f"; expected {example}"
            )
        if not parts.hostname and not (socket_host and "host=" in parts.query):
            raise ValueError(f"the URL names no host; expected {example}")
        return value

    return check


# URL settings: strings still (every client takes one), but checked when the settings load,
# so a malformed URL is one configuration line naming the variable — never a traceback from
# deep inside a driver at first use. Empty means "unset"; each setting decides what that is.
PostgresUrl = Annotated[
    str,
    AfterValidator(
        _checked_url(
            frozenset({"postgresql", "postgres", "postgresql+asyncpg"}),
            "postgresql://user:password@host:5432/database",
            socket_host=True,  # libpq's ?host=/socket/dir form, as the embedded server's
        )
    ),
]
AmqpUrl = Annotated[
    str,
    AfterValidator(
        _checked_url(frozenset({"amqp", "amqps"}), "amqp://user:password@host:5672/vhost")
    ),
]
HttpUrl = Annotated[
    str, AfterValidator(_checked_url(frozenset({"http", "https"}), "https://host[:port]/path"))
]


class ServiceSettings(BaseSettings):
    """Environment-driven settings common to all services (docs/reference/job-rules.md §8)."""

    model_config = SettingsConfigDict(env_file=None, extra="ignore", frozen=True)

    # Environment variables starting with one of these (here or in a subclass) are meant
    # for this service: one it does not know is reported at start-up (a misspelt name would
    # otherwise be ignored in silence). Prefixes several services share with different
    # fields (GITHUB_) are left out: another service's variable is not a typo.
    reported_prefixes: ClassVar[tuple[str, ...]] = (
        "SAN_",
        "DATABASE_",
        "AMQP_",
        "LOG_",
        "PROBE_",
        "TRACING_",
    )

    san_env: Literal["development", "test", "production"] = "development"
    service_name: str = "san"
    database_url: PostgresUrl = Field(
        default="",
        description="postgresql://… URL; empty in a local run: the launcher's embedded one",
    )
    amqp_url: AmqpUrl = DEFAULT_AMQP_URL
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
    otel_exporter_otlp_endpoint: HttpUrl = Field(
        default="", description="OTLP/HTTP collector, e.g. http://otel-collector:4318"
    )

    @model_validator(mode="after")
    def _database_required_in_production(self) -> ServiceSettings:
        if self.san_env == "production" and not self.database_url:
            raise ValueError("DATABASE_URL must be set when SAN_ENV=production")
        return self

    @model_validator(mode="after")
    def _no_placeholder_passwords_in_production(self) -> ServiceSettings:
        if self.san_env != "production":
            return self
        # Only what was set: the built-in default AMQP_URL (guest on localhost) cannot leak
        # anywhere — RabbitMQ accepts guest from localhost only.
        for name in sorted(self.model_fields_set):
            value = getattr(self, name)
            if not isinstance(value, str) or "://" not in value:
                continue
            try:
                parts = urlsplit(value)
            except ValueError:
                continue
            if parts.password is None:  # no password in the URL: another way to log in
                continue
            if unquote(parts.password).lower() in PLACEHOLDER_PASSWORDS:
                raise ValueError(
                    f"{name.upper()} uses a placeholder password ({unquote(parts.password)!r}); "
                    "set a real one when SAN_ENV=production"
                )
        return self

    def unknown_variables(
        self, environ: Mapping[str, str] | None = None
    ) -> list[tuple[str, str | None]]:
        """Variables with this service's prefixes that no setting reads, each with the
        closest known name (a likely typo) or None."""
        environ = os.environ if environ is None else environ
        prefixes = tuple(
            {p for cls in type(self).__mro__ for p in vars(cls).get("reported_prefixes", ())}
        )
        known = known_variables(type(self))
        unknown: list[tuple[str, str | None]] = []
        for name in sorted(environ):
            upper = name.upper()
            if upper.startswith(prefixes) and upper not in known:
                close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.75)
                unknown.append((name, close[0] if close else None))
        return unknown


def known_variables(cls: type[BaseSettings]) -> frozenset[str]:
    """The environment variables a settings class reads (upper case)."""
    prefix = str(cls.model_config.get("env_prefix", "") or "")
    names: set[str] = set()
    for name, field in cls.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, str):
            names.add(alias.upper())
        elif isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        else:
            names.add(f"{prefix}{name}".upper())
    return frozenset(names)


S = TypeVar("S", bound=ServiceSettings)


class ConfigurationError(SystemExit):
    """Settings that do not validate: the process stops with a readable message (and exit
    code 2), not a traceback — a deployer reads this line in a crash-looping pod's log."""


def load_settings(cls: type[S]) -> S:
    try:
        return cls()
    except ValidationError as exc:
        print(f"configuration error ({cls.__name__}): {describe_errors(exc)}", file=sys.stderr)
        raise ConfigurationError(2) from None


def describe_errors(exc: ValidationError) -> str:
    """Every problem of a settings class on one line, each naming its variable."""
    return "; ".join(_describe(error) for error in exc.errors())


def _describe(error: ErrorDetails) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    variable = "_".join(str(part) for part in error["loc"]).upper()
    return f"{variable}: {message}" if variable else message
