"""Bearer JWTs (docs/reference/job-rules.md §8): HS256 with `AUTH_JWT_SECRET`, or RS256/ES256 from
an external identity provider's JWKS (a URL or a file). Every token must carry `exp`, and live no
longer than `AUTH_JWT_MAX_LIFETIME_SECONDS`; `iss` and `aud` are checked when configured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TypeGuard

import jwt
from jwt.exceptions import InvalidSubjectError

from san_api.auth.cache import VerifiedTokens
from san_api.auth.jwks import JwksKeys, KeysUnavailable
from san_api.settings import ApiSettings

ALGORITHM = "HS256"
MAX_SUBJECT_LENGTH = 255
# The operator console's role (docs/reference/job-rules.md §2.6b): `role: operator` or `roles: [...,
# "operator"]`.
OPERATOR_ROLE = "operator"


class InvalidToken(Exception):
    pass


def mint(
    secret: str, subject: str, ttl_seconds: int = 24 * 3600, *, role: str | None = None
) -> str:
    now = int(time.time())
    claims: dict[str, object] = {"sub": subject, "iat": now, "exp": now + ttl_seconds}
    if role:
        claims["role"] = role
    return jwt.encode(claims, secret, ALGORITHM)


@dataclass(frozen=True)
class Claims:
    subject: str
    roles: frozenset[str]

    @property
    def operator(self) -> bool:
        return OPERATOR_ROLE in self.roles


def _roles(claims: dict[str, object]) -> frozenset[str]:
    roles: set[str] = set()
    role, listed = claims.get("role"), claims.get("roles")
    if isinstance(role, str):
        roles.add(role)
    if isinstance(listed, list):
        roles.update(r for r in listed if isinstance(r, str))
    return frozenset(roles)


@dataclass(frozen=True)
class TokenVerifier:
    """How the API checks a bearer token; built once by `create_app`."""

    secret: str
    max_lifetime_seconds: int
    leeway_seconds: int = 30
    issuer: str | None = None
    audience: str | None = None
    jwks: JwksKeys | None = None
    algorithms: tuple[str, ...] = (ALGORITHM,)
    cache_seconds: float = 0.0
    _verified: VerifiedTokens[Claims] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_verified", VerifiedTokens(self.cache_seconds))

    async def verify(self, token: str) -> str:
        """The token's subject (the user's external id), or InvalidToken saying why."""
        return (await self.verify_claims(token)).subject

    async def verify_claims(self, token: str) -> Claims:
        """The subject and the roles (`role` and/or `roles`), or InvalidToken saying why."""
        if (known := self._verified.get(token)) is not None:
            return known
        key: object = self.secret
        if self.jwks is not None:
            try:
                kid = jwt.get_unverified_header(token).get("kid")
            except jwt.InvalidTokenError as exc:
                raise InvalidToken("the token is not valid") from exc
            try:
                key = await self.jwks.key(kid if isinstance(kid, str) else None)
            except KeysUnavailable as exc:
                raise InvalidToken(str(exc)) from exc
        try:
            claims = jwt.decode(
                token,
                key,  # type: ignore[arg-type]
                algorithms=list(self.algorithms),
                issuer=self.issuer or None,
                audience=self.audience or None,
                leeway=self.leeway_seconds,
                options={
                    "require": ["sub", "exp", *(["iss"] if self.issuer else [])],
                    "verify_aud": bool(self.audience),
                    # checked below, after their types: pyjwt takes anything int() takes
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.MissingRequiredClaimError as exc:
            raise InvalidToken(f"the token has no '{exc.claim}' claim") from exc
        except InvalidSubjectError as exc:
            raise InvalidToken("the token's subject must be a string") from exc
        except jwt.InvalidIssuerError as exc:
            raise InvalidToken("the token's issuer is not accepted") from exc
        except jwt.InvalidAudienceError as exc:
            raise InvalidToken("the token is not meant for this API (audience)") from exc
        except jwt.InvalidTokenError as exc:
            raise InvalidToken("the token is not valid") from exc
        self._check_times(claims)
        expires = self._check_lifetime(claims)
        verified = Claims(_subject(claims.get("sub")), _roles(claims))
        self._verified.remember(token, verified, expires + self.leeway_seconds)
        return verified

    def _check_times(self, claims: dict[str, object]) -> None:
        """`exp`, `nbf` and `iat` are NumericDates (RFC 7519): numbers, else the token is
        refused saying which; then the token must be valid now, give or take the leeway."""
        times: dict[str, float] = {}
        for name in ("exp", "nbf", "iat"):
            if name in claims:
                value = claims[name]
                if not _is_number(value):
                    raise InvalidToken(f"the token's '{name}' claim must be a number")
                times[name] = value
        now, leeway = time.time(), self.leeway_seconds
        if times["exp"] <= now - leeway:
            raise InvalidToken("the token has expired")
        if times.get("nbf", now) > now + leeway or times.get("iat", now) > now + leeway:
            raise InvalidToken("the token is not valid yet")

    def _check_lifetime(self, claims: dict[str, object]) -> float:
        """The token's `exp`, once its lifetime is within the maximum."""
        exp, iat = claims["exp"], claims.get("iat")
        start = iat if _is_number(iat) else time.time()
        if not _is_number(exp):  # _check_times refused it; for the type checker
            raise InvalidToken("the token's 'exp' claim must be a number")
        if exp - start > self.max_lifetime_seconds + self.leeway_seconds:
            raise InvalidToken(
                f"the token lives longer than the maximum of {self.max_lifetime_seconds} seconds"
            )
        return float(exp)


def token_verifier(settings: ApiSettings) -> TokenVerifier:
    jwks = None
    algorithms: tuple[str, ...] = (ALGORITHM,)
    if settings.auth_jwt_jwks_url or settings.auth_jwt_jwks_file:
        jwks = JwksKeys(
            url=settings.auth_jwt_jwks_url,
            file=settings.auth_jwt_jwks_file,
            cache_seconds=settings.auth_jwt_jwks_cache_seconds,
        )
        algorithms = tuple(a.strip() for a in settings.auth_jwt_algorithms.split(",") if a.strip())
    return TokenVerifier(
        secret=settings.auth_jwt_secret,
        max_lifetime_seconds=settings.auth_jwt_max_lifetime_seconds,
        leeway_seconds=settings.auth_jwt_leeway_seconds,
        issuer=settings.auth_jwt_issuer or None,
        audience=settings.auth_jwt_audience or None,
        jwks=jwks,
        algorithms=algorithms,
        cache_seconds=settings.auth_jwt_cache_seconds,
    )


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _subject(subject: object) -> str:
    if not isinstance(subject, str):
        raise InvalidToken("the token's subject must be a string")
    if not subject.strip():
        raise InvalidToken("the token's subject must not be empty")
    if len(subject) > MAX_SUBJECT_LENGTH:
        raise InvalidToken(f"the token's subject is longer than {MAX_SUBJECT_LENGTH} characters")
    if not _storable(subject):
        raise InvalidToken("the token's subject must be text without NUL or lone surrogates")
    return subject


def _storable(text: str) -> bool:
    """PostgreSQL text holds neither NUL nor anything that is not valid UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text
