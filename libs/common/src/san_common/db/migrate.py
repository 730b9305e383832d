"""Schema migrations (Alembic). `san-migrate` upgrades the database to the newest revision."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alembic import command
from alembic.config import Config

from san_common.db.engine import async_url

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


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


def main(argv: list[str] | None = None) -> int:
    from san_common.settings import ServiceSettings, load_settings

    parser = argparse.ArgumentParser(prog="san-migrate", description=__doc__)
    parser.add_argument("revision", nargs="?", default="head")
    args = parser.parse_args(argv)
    settings = load_settings(ServiceSettings)
    if not settings.database_url:
        print("san-migrate: DATABASE_URL is not set", file=sys.stderr)
        return 2
    upgrade(settings.database_url, args.revision)
    print(f"san-migrate: database at revision {args.revision}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
