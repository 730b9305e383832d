"""`san-config`: the settings each installed service would start with, secrets masked.

    san-config                 every installed service's effective settings
    san-config api relay       only these services
    san-config --check         validate only: exit 0, or 2 with one line per service that
                               would refuse to start

Settings come from the environment, as the services read them (`make run` adds `.env`).
Each service announces its settings class under the `san.settings` entry point group, so
this command lists what is installed without importing any service by name.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from san_common import cli
from san_common.settings import describe_errors, known_variables

PROG = "san-config"
ENTRY_POINTS = "san.settings"
MASK = "***"


def settings_classes() -> dict[str, type[BaseSettings]]:
    """Installed services → their settings class, in name order."""
    found = {point.name: point.load() for point in metadata.entry_points(group=ENTRY_POINTS)}
    return dict(sorted(found.items()))


def is_secret(cls: type[BaseSettings], name: str) -> bool:
    """Fields declared `repr=False` are the secrets (keys, passwords, client secrets)."""
    return not cls.model_fields[name].repr


def shown(value: object, *, secret: bool) -> str:
    """A value fit for a terminal or a log: secrets masked (length hidden too), a URL's
    password replaced."""
    if secret:
        return MASK if value not in ("", None) else "(unset)"
    text = str(value)
    if "://" in text and urlsplit(text).password is not None:
        return cli.redact_url(text)
    return text if text else "(unset)"


def effective(cls: type[BaseSettings]) -> list[tuple[str, str, str]]:
    """(variable, value shown, where it came from) of every setting of `cls`."""
    settings = cls()
    env_names = {name.lower(): name for name in known_variables(cls)}
    prefix = str(cls.model_config.get("env_prefix", "") or "")
    rows = []
    for name in cls.model_fields:
        variable = env_names.get(f"{prefix}{name}".lower(), f"{prefix}{name}".upper())
        source = "environment" if name in settings.model_fields_set else "default"
        value: Any = getattr(settings, name)
        rows.append((variable, shown(value, secret=is_secret(cls, name)), source))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(PROG, __doc__ or "", distribution="san-common")
    parser.add_argument("services", nargs="*", metavar="SERVICE", help="only these services")
    parser.add_argument(
        "--check", action="store_true", help="validate only; exit 2 when a service would refuse"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    classes = settings_classes()
    unknown = sorted(set(args.services) - set(classes))
    if unknown:
        print(
            f"{PROG}: no installed service {', '.join(unknown)} (installed: {', '.join(classes)})",
            file=sys.stderr,
        )
        return cli.EXIT_USAGE
    wanted = {
        name: cls for name, cls in classes.items() if not args.services or name in args.services
    }
    problems: dict[str, list[str]] = {}  # one line per problem, however many services share it
    for name, cls in wanted.items():
        try:
            rows = effective(cls)
        except ValidationError as exc:
            problems.setdefault(describe_errors(exc), []).append(name)
            continue
        if not args.check:
            _print_table(name, rows)
    for problem, services in problems.items():
        print(f"{PROG}: configuration error ({', '.join(services)}): {problem}", file=sys.stderr)
    return cli.EXIT_USAGE if problems else 0


def _print_table(service: str, rows: list[tuple[str, str, str]]) -> None:
    width = max(len(variable) for variable, _, _ in rows)
    print(f"[{service}]")
    for variable, value, source in rows:
        print(f"  {variable.ljust(width)}  {value}  ({source})")
    print()


if __name__ == "__main__":
    raise SystemExit(main())
