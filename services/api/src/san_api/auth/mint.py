"""`san-token SUBJECT`: mint a bearer token for local use, signed with the API's secret."""

from __future__ import annotations

from san_api.auth.tokens import OPERATOR_ROLE, mint
from san_api.settings import ApiSettings
from san_common import cli
from san_common.settings import load_settings


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("san-token", __doc__ or "", distribution="san-api")
    parser.add_argument("subject", nargs="?", default="local-user", help="the user's external id")
    parser.add_argument("--ttl-hours", type=float, default=24.0)
    parser.add_argument(
        "--operator", action="store_true", help="add `role: operator` (the /admin console)"
    )
    args = parser.parse_args(argv)
    settings = load_settings(ApiSettings)
    ttl = int(args.ttl_hours * 3600)
    if not 0 < ttl <= settings.auth_jwt_max_lifetime_seconds:
        parser.error(
            f"--ttl-hours must be positive and at most AUTH_JWT_MAX_LIFETIME_SECONDS "
            f"({settings.auth_jwt_max_lifetime_seconds} s): the API refuses longer tokens"
        )
    role = OPERATOR_ROLE if args.operator else None
    print(mint(settings.auth_jwt_secret, args.subject, ttl, role=role))


if __name__ == "__main__":
    main()
