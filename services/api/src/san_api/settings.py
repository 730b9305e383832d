from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from san_common.github.settings import GithubAccessSettings
from san_common.local_secrets import PLACEHOLDERS, local_secret
from san_common.settings import HttpUrl
from san_common.usage.budgets import BudgetSettings


class ApiSettings(GithubAccessSettings, BudgetSettings):
    reported_prefixes: ClassVar[tuple[str, ...]] = ("API_", "AUTH_")
    service_name: str = "api"
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=0, le=65535)
    auth_jwt_secret: str = Field(default="", repr=False)
    auth_jwt_max_lifetime_seconds: int = Field(
        default=24 * 3600, ge=60, description="Longest accepted exp - iat; exp is required"
    )
    auth_jwt_leeway_seconds: int = Field(default=30, ge=0, le=300, description="Clock skew")
    auth_jwt_issuer: str = Field(default="", description="Required `iss` when set")
    auth_jwt_audience: str = Field(default="", description="Required `aud` when set")
    auth_jwt_jwks_url: str = Field(default="", description="External IdP keys (RS256 mode)")
    auth_jwt_jwks_file: str = Field(default="", description="The same, from a file")
    auth_jwt_jwks_cache_seconds: float = Field(default=300, ge=1)
    auth_jwt_cache_seconds: float = Field(
        default=30, ge=0, description="Keep a verified token this long (0: verify every time)"
    )
    auth_jwt_algorithms: str = Field(
        default="RS256", description="Accepted in JWKS mode (comma-separated, asymmetric only)"
    )
    scrap_max_bytes: int = Field(default=100_000, ge=1, description="Normalized scrap size limit")
    request_max_bytes: int = Field(default=1_000_000, ge=1024, description="Any request body")
    api_docs_enabled: bool | None = Field(
        default=None,
        description="/docs, /redoc, /openapi.json; unset: on, except under SAN_ENV=production",
    )
    api_database_timeout_seconds: float = Field(
        default=10,
        gt=0,
        description="Longest wait on PostgreSQL for a connection, a connect or a statement",
    )
    # Direct publish of a request's jobs (docs/architecture.md, "Direct publish")
    api_direct_publish: bool = Field(
        default=True,
        description="Publish a user's first active job of a type right after the commit,"
        " the relay as the fallback (false: every message goes through the relay)",
    )
    api_direct_grace_seconds: float = Field(
        default=3.0,
        gt=0,
        le=60,
        description="A directly published row is due for the relay only this long after its"
        " commit: the relay publishes it if the API has not marked it by then",
    )
    api_direct_confirm_seconds: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="Longest wait for the broker's confirm of a direct publish; an"
        " unconfirmed message is left to the relay",
    )
    api_forwarded_allow_ips: str = Field(
        default="127.0.0.1",
        description="Proxies (IPs or CIDRs, comma-separated; * for any) whose X-Forwarded-For"
        " and X-Forwarded-Proto are believed: the ingress or reverse proxy in front of the API",
    )
    # The HTTP edge (san_api.edge, docs/security.md)
    http_max_header_bytes: int = Field(default=16_384, ge=1024, le=1_048_576)
    http_header_timeout_seconds: float = Field(default=10, gt=0)
    http_body_timeout_seconds: float = Field(default=30, gt=0)
    http_keep_alive_seconds: int = Field(default=5, ge=1)
    http_max_connections: int = Field(default=500, ge=1)
    # Job-creating endpoints (docs/security.md, "Rate limits and quotas")
    rate_limit_enabled: bool = True
    rate_limit_jobs_per_minute: float = Field(
        default=30, ge=0, description="Bucket refill per user and endpoint"
    )
    rate_limit_jobs_burst: int = Field(default=10, ge=1, description="Bucket size")
    rate_limit_github_per_minute: float = Field(
        default=6,
        ge=0,
        description="Bucket refill per user and endpoint of the routes that call GitHub"
        " (PUT /me/github, the OAuth flow, repository linking)",
    )
    rate_limit_github_burst: int = Field(default=5, ge=1, description="Their bucket size")
    active_jobs_max_per_user: int = Field(
        default=50, ge=1, description="PENDING/PROCESSING jobs one user may have"
    )
    active_jobs_retry_after_seconds: int = Field(default=30, ge=1)
    similar_cards_threshold: float = Field(default=0.5, ge=0, le=2)
    similar_cards_k: int = Field(default=10, ge=1, le=100)
    # GitHub (docs/reference/job-rules.md §4, §8)
    github_oauth_url: HttpUrl = "https://github.com"
    github_client_id: str = ""
    github_client_secret: str = Field(default="", repr=False)
    github_oauth_redirect_url: HttpUrl = Field(
        default="", description="Callback URL sent to GitHub; empty uses the OAuth app's own"
    )
    github_oauth_state_ttl_seconds: int = Field(default=600, ge=30, le=3600)
    github_oauth_states_per_user: int = Field(
        default=5, ge=1, le=100, description="Unused OAuth states kept per user; oldest go first"
    )
    github_timeout_seconds: float = Field(default=10.0, gt=0)
    til_commit_max_path_suffix: int = Field(
        default=20, ge=0, le=1000, description="TIL/2026-12-02.md, then -1 … -N, then 409"
    )

    # Operator console (docs/reference/job-rules.md §2.6b, docs/operations.md)
    admin_proxy_header: str = Field(
        default="",
        description="Header an auth proxy sets to the operator's name (e.g. X-Forwarded-User); "
        "empty: only operator tokens. The proxy must strip it from client requests.",
    )
    rabbitmq_management_url: HttpUrl = Field(
        default="",
        description="http://user:pass@host:15672 of the management API (queue depths, "
        "consumers, unacked); empty: passive declares (depth and consumers only)",
    )
    sse_keepalive_seconds: float = Field(default=15.0, gt=0, le=300)
    # Event streams (san_api.job_events, docs/security.md "Event streams")
    sse_streams_per_user: int = Field(
        default=10, ge=1, description="Open job event streams one user may hold per API process"
    )
    sse_streams_max: int | None = Field(
        default=None,
        ge=1,
        description="Open job event streams per API process, below HTTP_MAX_CONNECTIONS;"
        " unset: 40 % of it",
    )
    sse_stream_max_seconds: float = Field(
        default=300,
        gt=0,
        description="A stream is closed after this long; the client resumes with Last-Event-ID",
    )
    sse_retry_after_seconds: int = Field(default=10, ge=1)
    admin_bulk_limit: int = Field(default=10_000, ge=1, le=1_000_000)

    @property
    def docs_enabled(self) -> bool:
        if self.api_docs_enabled is None:
            return self.san_env != "production"
        return self.api_docs_enabled

    @property
    def streams_max(self) -> int:
        """SSE_STREAMS_MAX, or 40 % of HTTP_MAX_CONNECTIONS: streams are long-lived
        connections, and the rest must stay free for every other request."""
        if self.sse_streams_max is not None:
            return self.sse_streams_max
        return max(1, self.http_max_connections * 2 // 5)

    @model_validator(mode="after")
    def _streams_below_connections(self) -> ApiSettings:
        if self.sse_streams_max is not None and self.sse_streams_max >= self.http_max_connections:
            raise ValueError("SSE_STREAMS_MAX must be below HTTP_MAX_CONNECTIONS")
        return self

    @model_validator(mode="after")
    def _auth_secret(self) -> ApiSettings:
        if self.auth_jwt_jwks_url and self.auth_jwt_jwks_file:
            raise ValueError("set one of AUTH_JWT_JWKS_URL and AUTH_JWT_JWKS_FILE, not both")
        if self.auth_jwt_jwks_url or self.auth_jwt_jwks_file:
            algorithms = {a.strip() for a in self.auth_jwt_algorithms.split(",") if a.strip()}
            if not algorithms or any(a.startswith(("HS", "none")) for a in algorithms):
                raise ValueError("AUTH_JWT_ALGORITHMS must name asymmetric algorithms (RS256…)")
        if self.auth_jwt_secret.lower() in PLACEHOLDERS or len(self.auth_jwt_secret) < 32:
            if self.san_env == "production":
                raise ValueError(
                    "AUTH_JWT_SECRET must be set to a real secret (≥ 32 chars) in production"
                )
            if not self.auth_jwt_secret:
                object.__setattr__(
                    self, "auth_jwt_secret", local_secret(self.data_dir, "auth_jwt_secret")
                )
        return self
