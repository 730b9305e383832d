"""Schema migrations (Alembic).

    san-migrate                     upgrade to the newest revision (= `upgrade head`)
    san-migrate upgrade [REV]       upgrade to REV (default head)
    san-migrate downgrade REV       downgrade to REV (`base` = an empty schema)
    san-migrate current             print the database's revision
    san-migrate check [--wait S]    exit 0 when the database is at this code's newest revision
                                    (or at a newer one it does not know), else 1; --wait keeps
                                    checking for S seconds (the pods' init container)

REV is a revision id (`0002`) or a unique prefix of one. Exit codes: 0 done, 1 the database
is unreachable or not at head (check), 2 an unknown revision or a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import text

from san_common import cli
from san_common.db.engine import async_url, create_engine
from san_common.dependencies import (
    CHECK_TIMEOUT_SECONDS,
    DATABASE_ERRORS,
    database_failure,
    missing_pgvector,
)

PROG = "san-migrate"
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
CHECK_INTERVAL_SECONDS = 2.0
_PGVECTOR_AVAILABLE = text(
    "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'vector')"
)


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # `%` is interpolation syntax in Alembic's ini parser.
    config.set_main_option("sqlalchemy.url", async_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


def scripts() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ScriptDirectory.from_config(config)


def head() -> str:
    found = scripts().get_current_head()
    assert found is not None, "no migrations"
    return found


async def current(database_url: str) -> str | None:
    """The database's revision, None for a database no migration has touched."""
    engine = create_engine(database_url, pool_size=1)
    try:
        async with engine.connect() as connection:
            heads: tuple[str, ...] = await connection.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_heads()
            )
    finally:
        await engine.dispose()
    return heads[0] if heads else None


class UnknownRevision(Exception):
    pass


def resolve(revision: str) -> str | None:
    """A revision id (or unique prefix, `head`, `base`) → its full id; None for `base`."""
    if revision == "base":
        return None
    try:
        found = scripts().get_revision(revision)
    except CommandError as exc:  # an ambiguous prefix or a malformed name
        raise UnknownRevision(f"{revision!r}: {exc}") from None
    if found is None:
        raise UnknownRevision(f"{revision!r}")
    return found.revision


def is_ancestor(older: str | None, newer: str | None) -> bool:
    """`older` comes before or is `newer` in the (linear) history."""
    if older is None:
        return True
    if newer is None:
        return False
    return any(r.revision == older for r in scripts().iterate_revisions(newer, "base"))


def _known(revision: str) -> bool:
    try:
        return scripts().get_revision(revision) is not None
    except CommandError:
        return False


def _label(revision: str | None) -> str:
    return revision or "base (no schema)"


def _build_parser() -> argparse.ArgumentParser:
    parser = cli.parser(PROG, __doc__ or "", distribution="san-common")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    up = commands.add_parser("upgrade", help="upgrade to REV (default: head)")
    up.add_argument("revision", nargs="?", default="head", metavar="REV")
    down = commands.add_parser("downgrade", help="downgrade to REV (base = empty schema)")
    down.add_argument("revision", metavar="REV")
    commands.add_parser("current", help="print the database's revision")
    check = commands.add_parser("check", help="exit 0 when the database is at head, else 1")
    check.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="keep checking this long (unreachable or behind) before giving up",
    )  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from san_common.settings import ServiceSettings, load_settings

    args = _build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    settings = load_settings(ServiceSettings)
    if not settings.database_url:
        print(f"{PROG}: DATABASE_URL is not set", file=sys.stderr)
        return cli.EXIT_USAGE
    url = settings.database_url
    try:
        if args.command == "check":
            return _check(url, args.wait)
        asyncio.run(_preflight(url))
        if args.command == "current":
            return _current(url)
        if args.command == "downgrade":
            return _downgrade(url, args.revision)
        return _upgrade(url, getattr(args, "revision", "head"))
    except UnknownRevision as exc:
        known = ", ".join(r.revision for r in reversed(list(scripts().walk_revisions())))
        print(f"{PROG}: unknown revision {exc} (known: {known}, head, base)", file=sys.stderr)
        return cli.EXIT_USAGE
    except DATABASE_ERRORS as exc:
        raise database_failure(PROG, url, exc) from None


async def _preflight(url: str) -> None:
    """Before any migration runs: the server answers, accepts the login, and can give the
    database pgvector (the first migration creates the extension) — each a one-line exit."""
    engine = create_engine(url, pool_size=1)
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_SECONDS), engine.connect() as connection:
            available = (
                await connection.execute(
                    text(
                        "SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'vector')"
                    )
                )
            ).scalar_one()
    finally:
        await engine.dispose()
    if not available:
        raise missing_pgvector(PROG, url, installable=False)


def _current(url: str) -> int:
    at = asyncio.run(current(url))
    newest = head()
    state = "head" if at == newest else f"behind head {newest}"
    print(f"{PROG}: database at {_label(at)} ({state})")
    return 0


def _upgrade(url: str, revision: str) -> int:
    target = resolve(revision)
    before = asyncio.run(current(url))
    if before != target and is_ancestor(target, before):
        print(
            f"{PROG}: database at {_label(before)}, already past {_label(target)}; "
            f"nothing done (`{PROG} downgrade {target or 'base'}` goes back)"
        )
        return 0
    if target is not None:
        upgrade(url, target)
    after = asyncio.run(current(url))
    if after == before:
        print(f"{PROG}: database already at {_label(after)}; nothing to do")
    else:
        print(f"{PROG}: upgraded {_label(before)} → {_label(after)}")
    return 0


def _downgrade(url: str, revision: str) -> int:
    target = resolve(revision)
    before = asyncio.run(current(url))
    if before != target and is_ancestor(before, target):
        print(
            f"{PROG}: database at {_label(before)}, older than {_label(target)}; "
            f"nothing done (`{PROG} upgrade {target}` goes forward)"
        )
        return 0
    downgrade(url, target or "base")
    after = asyncio.run(current(url))
    if after == before:
        print(f"{PROG}: database already at {_label(after)}; nothing to do")
    else:
        print(f"{PROG}: downgraded {_label(before)} → {_label(after)}")
    return 0


def _check(url: str, wait: float) -> int:
    newest = head()
    deadline = time.monotonic() + wait
    while True:
        try:
            at: str | None = asyncio.run(current(url))
            if at is not None and at != newest and not _known(at):
                # A newer release migrated ahead: additive migrations keep this code working.
                print(f"{PROG}: database at {at}, newer than this code's head {newest}")
                return 0
            problem = None if at == newest else f"at {_label(at)}, head is {newest}"
        except DATABASE_ERRORS as exc:
            if time.monotonic() >= deadline:
                raise
            problem = f"unreachable ({cli.describe(exc)})"
        if problem is None:
            print(f"{PROG}: database at head {newest}")
            return 0
        if time.monotonic() >= deadline:
            print(f"{PROG}: database {problem}: run `{PROG} upgrade`", file=sys.stderr)
            return 1
        time.sleep(CHECK_INTERVAL_SECONDS)  # an init container's poll, inside the deadline


if __name__ == "__main__":
    raise SystemExit(main())
