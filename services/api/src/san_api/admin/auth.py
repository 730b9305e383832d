"""The operator role (docs/reference/job-rules.md §2.6b): every /admin route depends on
`CurrentOperator`.

An operator is a bearer token (header, or the console's HttpOnly cookie) whose claims carry
`role: operator` (or `roles: [..., "operator"]`), or — only when `ADMIN_PROXY_HEADER` is set —
the name an authenticating proxy put in that header. A valid token without the role gets
403; no or a bad token 401 (the console's pages redirect to the login form instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from san_api.auth.tokens import InvalidToken, TokenVerifier
from san_api.deps import SettingsDep
from san_api.errors import Forbidden, Unauthorized

COOKIE = "san_admin"

_bearer = HTTPBearer(auto_error=False)


@dataclass(frozen=True)
class Operator:
    name: str
    via: str  # token | cookie | proxy


async def operator_from_token(request: Request, token: str, via: str) -> Operator:
    verifier: TokenVerifier = request.app.state.tokens
    try:
        claims = await verifier.verify_claims(token)
    except InvalidToken as exc:
        raise Unauthorized(f"Invalid bearer token: {exc}") from exc
    if not claims.operator:
        raise Forbidden("This token does not carry the operator role")
    return Operator(claims.subject, via)


async def get_operator(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Operator:
    if settings.admin_proxy_header:
        name = request.headers.get(settings.admin_proxy_header, "").strip()
        if name:
            return Operator(name[:255], "proxy")
    if credentials is not None and credentials.scheme.lower() == "bearer":
        return await operator_from_token(request, credentials.credentials, "token")
    cookie = request.cookies.get(COOKIE)
    if cookie:
        return await operator_from_token(request, cookie, "cookie")
    raise Unauthorized("An operator token is required: 'Authorization: Bearer <token>'")


CurrentOperator = Annotated[Operator, Depends(get_operator)]
