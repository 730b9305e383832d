"""The console scripts as a deployer meets them: `--help` and `--version` answer and exit 0,
an unreachable dependency ends a service with one line naming it (exit 1, no traceback),
`san-migrate` says honestly where the database is, and misspelt settings are reported."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests import infra
from tests.conftest import JWT_SECRET
from tests.deploy.services import all_console_scripts

SCRIPTS = sorted(all_console_scripts())


def _entry_point(script: str) -> metadata.EntryPoint:
    [found] = [e for e in metadata.entry_points(group="console_scripts") if e.name == script]
    return found


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_console_script_answers_help_and_version(
    script: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    main = _entry_point(script).load()
    monkeypatch.setattr(sys, "argv", [script, "--help"])  # as the console script calls it
    with pytest.raises(SystemExit) as help_exit:
        main()
    assert help_exit.value.code == 0
    assert f"usage: {script}" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", [script, "--version"])
    with pytest.raises(SystemExit) as version_exit:
        main()
    assert version_exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"{script} {metadata.version(_package(script))}"


def _package(script: str) -> str:
    return all_console_scripts()[script]


def _run(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "AMQP_"))}
    return subprocess.run(
        args, env={**base, **env}, capture_output=True, text=True, timeout=timeout
    )


def _script(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _assert_one_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("script", ["san-relay", "san-ai-worker", "san-github-worker"])
def test_a_service_that_needs_the_broker_exits_with_one_line_when_it_is_unreachable(
    script: str, db_url: str, tmp_path: Path
) -> None:
    nowhere = f"amqp://san:hunter2-secret@127.0.0.1:{infra.free_port()}/"
    result = _run(
        [_script(script)],
        {"DATABASE_URL": db_url, "AMQP_URL": nowhere, "DATA_DIR": str(tmp_path)},
    )
    _assert_one_line(result, f"{script}: cannot reach RabbitMQ", "127.0.0.1")
    assert "hunter2-secret" not in result.stderr, "the password stays out of the message"


@pytest.mark.parametrize("args", [["san-api"], ["san-recovery"], ["san-migrate"]])
def test_a_service_exits_with_one_line_when_postgresql_is_unreachable(
    args: list[str], tmp_path: Path
) -> None:
    nowhere = f"postgresql://san:hunter2-secret@127.0.0.1:{infra.free_port()}/san"
    result = _run(
        [_script(args[0]), *args[1:]],
        {"DATABASE_URL": nowhere, "DATA_DIR": str(tmp_path), "AUTH_JWT_SECRET": JWT_SECRET},
    )
    _assert_one_line(result, f"{args[0]}: cannot reach PostgreSQL", "127.0.0.1")
    assert "hunter2-secret" not in result.stderr


def test_san_migrate_upgrade_downgrade_current_and_check(fresh_db_url: str) -> None:
    def migrate(*args: str) -> subprocess.CompletedProcess[str]:
        return _run([_script("san-migrate"), *args], {"DATABASE_URL": fresh_db_url})

    from san_common.db.migrate import head

    newest = head()
    current = migrate("current")
    assert current.returncode == 0 and f"at {newest} (head)" in current.stdout, current
    assert migrate("check").returncode == 0

    down = migrate("downgrade", "0001")
    assert down.returncode == 0 and f"downgraded {newest} → 0001" in down.stdout, down
    behind = migrate("check")
    assert behind.returncode == 1
    assert f"at 0001, head is {newest}" in behind.stderr, behind
    assert f"behind head {newest}" in migrate("current").stdout

    # asking for an older revision than the database's changes nothing, and says so
    up_to_base = migrate("upgrade", "base")
    assert up_to_base.returncode == 0 and "already past" in up_to_base.stdout, up_to_base
    assert "at 0001" in migrate("current").stdout

    unknown = migrate("upgrade", "0999")
    assert unknown.returncode == 2 and "unknown revision" in unknown.stderr, unknown
    assert "Traceback" not in unknown.stderr
    assert migrate("downgrade", "nope").returncode == 2

    up = migrate()  # no command: upgrade to head, what the Job and compose run
    assert up.returncode == 0 and f"upgraded 0001 → {newest}" in up.stdout, up
    again = migrate("upgrade")
    assert again.returncode == 0 and "already at" in again.stdout, again
    assert migrate("check", "--wait", "5").returncode == 0

    # a newer release migrated ahead (a revision this code does not know): still current
    await_sql(fresh_db_url, "UPDATE alembic_version SET version_num = '0999_from_the_future'")
    ahead = migrate("check")
    assert ahead.returncode == 0 and "newer than this code's head" in ahead.stdout, ahead


def await_sql(url: str, sql: str) -> None:
    import asyncio

    import asyncpg

    from san_common.db.engine import plain_url

    async def run() -> None:
        connection = await asyncpg.connect(plain_url(url))
        try:
            await connection.execute(sql)
        finally:
            await connection.close()

    asyncio.run(run())


def test_check_wait_gives_up_with_one_line_when_the_database_never_comes(tmp_path: Path) -> None:
    nowhere = f"postgresql://san:pw-long-enough@127.0.0.1:{infra.free_port()}/san"
    result = _run([_script("san-migrate"), "check", "--wait", "1"], {"DATABASE_URL": nowhere})
    _assert_one_line(result, "san-migrate: cannot reach PostgreSQL")


def test_unknown_settings_variables_with_the_service_prefix_are_reported(
    db_url: str, tmp_path: Path
) -> None:
    result = _run(
        [_script("san-recovery"), "run", "ghost"],
        {
            "DATABASE_URL": db_url,
            "DATA_DIR": str(tmp_path),
            "RECOVERY_SHEDULE": "0 * * * *",  # misspelt
            "RELAY_BATCH_SIZE": "5",  # the relay's: not recovery's business
            "LOG_FORMAT": "console",
        },
    )
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "unknown setting" in line]
    assert "variable=RECOVERY_SHEDULE" in line and "did_you_mean=RECOVERY_SCHEDULE" in line
