"""`san-config` shows each installed service's effective settings with every secret masked,
and `--check` refuses bad settings in one line; `make run` reads `.env` and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECRETS = {
    "AI_API_KEY": "sk-live-do-not-print-4242",
    "AUTH_JWT_SECRET": "jwt-secret-do-not-print-" + "x" * 32,
    "GITHUB_CLIENT_SECRET": "gh-client-secret-do-not-print",
}


def _config(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "AMQP_"))}
    return subprocess.run(
        [str(Path(sys.executable).with_name("san-config")), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_san_config_prints_every_service_with_secrets_masked(tmp_path: Path) -> None:
    result = _config(
        DATA_DIR=str(tmp_path),
        DATABASE_URL="postgresql://san:db-password-do-not-print@db:5432/san",
        AI_PROVIDER="openai",
        **SECRETS,
    )
    assert result.returncode == 0, result.stderr
    for service in ("api", "relay", "ai-worker", "github-worker", "recovery"):
        assert f"[{service}]" in result.stdout
    assert "db-password-do-not-print" not in result.stdout
    assert "postgresql://san:***@db:5432/san" in result.stdout
    for name, value in SECRETS.items():
        assert value not in result.stdout, f"{name} printed"
        assert any(line.split()[:2] == [name, "***"] for line in result.stdout.splitlines()), name
    assert any(
        line.split() == ["AI_PROVIDER", "openai", "(environment)"]
        for line in result.stdout.splitlines()
    )


def test_san_config_check_refuses_a_malformed_url_in_one_line(tmp_path: Path) -> None:
    result = _config("--check", DATA_DIR=str(tmp_path), AMQP_URL="http://rabbit:5672")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "AMQP_URL" in line and "expected amqp://" in line, line
    assert result.stdout == ""


def test_san_config_names_an_unknown_service(tmp_path: Path) -> None:
    result = _config("nope", DATA_DIR=str(tmp_path))
    assert result.returncode == 2 and "no installed service nope" in result.stderr


def test_make_run_reads_dotenv_and_says_so_in_its_first_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "dev"))  # as `python dev/run_local.py` runs
    from run_local import read_dotenv

    dotenv = tmp_path / ".env"
    dotenv.write_text("AI_PROVIDER=openai\nAI_API_KEY=sk-from-dotenv\n# a comment\n")
    assert read_dotenv(dotenv) == {"AI_PROVIDER": "openai", "AI_API_KEY": "sk-from-dotenv"}
    first_line = capsys.readouterr().out.splitlines()[0]
    assert first_line == "run: read .env (AI_API_KEY, AI_PROVIDER); the environment overrides it"
    assert "sk-from-dotenv" not in first_line

    assert read_dotenv(tmp_path / "missing.env") == {}
    assert "no .env" in capsys.readouterr().out
