"""`san-token SUBJECT`: mint a bearer token for local use, signed with the API's secret."""

from __future__ import annotations

import argparse

from san_api.auth.tokens import mint
from san_api.settings import ApiSettings
from san_common.settings import load_settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="san-token", description=__doc__)
    parser.add_argument("subject", nargs="?", default="local-user", help="the user's external id")
    parser.add_argument("--ttl-hours", type=float, default=24.0)
    args = parser.parse_args(argv)
    print(
        mint(load_settings(ApiSettings).auth_jwt_secret, args.subject, int(args.ttl_hours * 3600))
    )


if __name__ == "__main__":
    main()
