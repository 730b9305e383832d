"""Cross-site request forgery on the operator console (docs/security.md, "Console CSRF").

The console authenticates a browser with a cookie, and an authenticating proxy
(`ADMIN_PROXY_HEADER`) adds its header to whatever the browser sends: both are *ambient*
credentials, which a page on another origin can make the browser send with a form POST.
`SameSite=Strict` stops another site, not a sibling subdomain or another port of the same
host (same site, other origin). So an unsafe request (not GET/HEAD/OPTIONS) under `/admin`
that carries ambient credentials — and any `POST /admin/login`, whose answer would sign the
browser in (login CSRF) — must show it comes from the console's own origin:

- `Sec-Fetch-Site: same-origin` (every current browser sends it, and a page cannot forge it);
- without that header (an older browser), an `Origin` equal to the request's own origin.

Anything else is refused with 403 before the route runs, so nothing changes. A request with
`Authorization: Bearer …` passes: a browser never adds that header by itself, and a page on
another origin cannot set it without a CORS preflight, which the API never grants — so
scripts and `san-admin` call `/admin/api` from anywhere with their token, and only that way.

Checked by origin rather than a double-submit token: nothing to render into every form and
htmx call, and the check cannot be forgotten on a new route (it is not per route).
"""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.types import Scope, Send

from san_api.admin.auth import COOKIE
from san_api.edge import send_problem

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOGIN = "/admin/login"
_DEFAULT_PORTS = {"http": "80", "https": "443"}


class ConsoleCsrf:
    """The check, run by the edge (san_api.edge) before any route."""

    def __init__(self, *, proxy_header: str = "") -> None:
        self.proxy_header = proxy_header.lower()

    async def refuse(self, send: Send, scope: Scope) -> None:
        log.warning(
            "cross-origin console request refused",
            extra={"fields": {"method": scope["method"], "path": scope["path"]}},
        )
        await send_problem(
            send,
            scope,
            403,
            "CROSS_ORIGIN_REFUSED",
            "this console action must come from the console's own pages (or carry an"
            " 'Authorization: Bearer' token)",
            title="Cross-origin request refused",
        )

    def refused(self, scope: Scope) -> bool:
        path: str = scope["path"]
        if scope["method"] in SAFE_METHODS or not (path == "/admin" or path.startswith("/admin/")):
            return False
        headers = Headers(scope=scope)
        if headers.get("authorization", "").lower().startswith("bearer "):
            return False
        ambient = _has_cookie(headers, COOKIE) or (
            bool(self.proxy_header) and self.proxy_header in headers
        )
        if not ambient and path != LOGIN:
            return False  # no credentials to abuse: the route answers 401 / the login form
        return not same_origin(scope, headers)


def same_origin(scope: Scope, headers: Headers) -> bool:
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site == "same-origin"
    origin = headers.get("origin")
    host = headers.get("host")
    if not origin or origin == "null" or not host:
        return False
    return _normalized(origin) == _normalized(f"{scope['scheme']}://{host}")


def _normalized(origin: str) -> str:
    scheme, _, netloc = origin.lower().rstrip("/").partition("://")
    host, colon, port = netloc.rpartition(":")
    if colon and port == _DEFAULT_PORTS.get(scheme):
        netloc = host
    return f"{scheme}://{netloc}"


def _has_cookie(headers: Headers, name: str) -> bool:
    for header in headers.getlist("cookie"):
        for part in header.split(";"):
            if part.strip().split("=", 1)[0] == name:
                return True
    return False
