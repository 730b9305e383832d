"""docs/reference/job-rules.md §8: a local run needs no configuration (missing secrets are generated
once into the data directory and reused); a production setting refuses to start without real
ones."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from san_ai_worker.settings import AiWorkerSettings
from san_api.settings import ApiSettings
from san_common.settings import ServiceSettings
from tests.conftest import TOKEN_KEYS

DB = "postgresql://san:pw@db:5432/san"
REAL_SECRET = "s" * 48


def test_development_generates_the_jwt_secret_once_and_reuses_it(tmp_path: Path) -> None:
    first = ApiSettings(data_dir=tmp_path, database_url=DB)
    again = ApiSettings(data_dir=tmp_path, database_url=DB)
    assert len(first.auth_jwt_secret) >= 32
    assert again.auth_jwt_secret == first.auth_jwt_secret
    secret_file = tmp_path / "secrets" / "auth_jwt_secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    other = ApiSettings(data_dir=tmp_path / "elsewhere", database_url=DB)
    assert other.auth_jwt_secret != first.auth_jwt_secret


@pytest.mark.parametrize("secret", ["", "changeme", "secret", "too-short"])
def test_production_refuses_a_missing_or_weak_jwt_secret(tmp_path: Path, secret: str) -> None:
    with pytest.raises(ValidationError, match="AUTH_JWT_SECRET"):
        ApiSettings(
            san_env="production",
            data_dir=tmp_path,
            database_url=DB,
            auth_jwt_secret=secret,
            token_encryption_keys=TOKEN_KEYS,
        )
    assert not (tmp_path / "secrets").exists(), "production must not fall back to local secrets"


def test_production_accepts_real_secrets(tmp_path: Path) -> None:
    settings = ApiSettings(
        san_env="production",
        data_dir=tmp_path,
        database_url=DB,
        auth_jwt_secret=REAL_SECRET,
        token_encryption_keys=TOKEN_KEYS,
    )
    assert settings.auth_jwt_secret == REAL_SECRET


def test_production_needs_a_database_url() -> None:
    with pytest.raises(ValidationError, match="DATABASE_URL"):
        ServiceSettings(san_env="production")


def test_production_openai_provider_needs_an_api_key(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="AI_API_KEY"):
        AiWorkerSettings(
            san_env="production",
            data_dir=tmp_path,
            database_url=DB,
            ai_provider="openai",
            token_encryption_keys=TOKEN_KEYS,
        )


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS}, "AUTH_JWT_SECRET"),
        ({"AUTH_JWT_SECRET": REAL_SECRET}, "TOKEN_ENCRYPTION_KEYS"),
    ],
)
def test_the_api_process_refuses_to_start_in_production_without_secrets(
    tmp_path: Path, given: dict[str, str], missing: str
) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AUTH_JWT_SECRET", "TOKEN_ENCRYPTION_KEYS", "DATABASE_URL")
    }
    env.update(SAN_ENV="production", DATABASE_URL=DB, DATA_DIR=str(tmp_path), **given)
    result = subprocess.run(
        [sys.executable, "-m", "san_api.main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert missing in result.stderr
    assert "configuration error" in result.stderr
    assert "Traceback" not in result.stderr, "a deployer gets one readable line, not a trace"


@pytest.mark.parametrize(
    ("variable", "url"),
    [
        ("database_url", "postgresql://san:san-local-only@db:5432/san"),
        ("amqp_url", "amqp://guest:guest@rabbitmq:5672/"),
        ("amqp_url", "amqp://san:@rabbitmq:5672/"),
    ],
)
def test_production_refuses_placeholder_passwords_in_every_url(variable: str, url: str) -> None:
    values = {"database_url": "postgresql://san:a-real-password@db/san", variable: url}
    with pytest.raises(ValidationError, match=f"{variable.upper()} uses a placeholder password"):
        ServiceSettings(san_env="production", **values)  # type: ignore[arg-type]
    ServiceSettings(san_env="development", **values)  # type: ignore[arg-type]


def test_production_accepts_urls_with_real_or_no_passwords() -> None:
    ServiceSettings(
        san_env="production",
        database_url="postgresql://san@db/san",  # .pgpass or a client certificate
        amqp_url="amqp://san:a-real-password@rabbitmq:5672/",
    )


def test_unknown_variables_are_those_with_the_services_prefixes() -> None:
    from san_relay.settings import RelaySettings

    settings = RelaySettings(database_url=DB)
    environ = {
        "RELAY_BATCH_SIZ": "5",  # a typo of RELAY_BATCH_SIZE
        "RELAY_BATCH_SIZE": "5",
        "AMQP_URI": "amqp://x",  # a shared prefix, a typo of AMQP_URL
        "WORKER_PREFETCH": "3",  # another service's prefix
        "GITHUB_CLIENT_ID": "x",  # a prefix several services share
        "PATH": "/bin",
    }
    assert settings.unknown_variables(environ) == [
        ("AMQP_URI", "AMQP_URL"),
        ("RELAY_BATCH_SIZ", "RELAY_BATCH_SIZE"),
    ]
