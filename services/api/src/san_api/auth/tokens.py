from __future__ import annotations

import time

import jwt

ALGORITHM = "HS256"


class InvalidToken(Exception):
    pass


def mint(secret: str, subject: str, ttl_seconds: int = 24 * 3600) -> str:
    now = int(time.time())
    return jwt.encode({"sub": subject, "iat": now, "exp": now + ttl_seconds}, secret, ALGORITHM)


def verify(secret: str, token: str) -> str:
    """The token's subject (the user's external id); `exp` is honoured when present."""
    try:
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], options={"require": ["sub"]})
    except jwt.ExpiredSignatureError as exc:
        raise InvalidToken("the token has expired") from exc
    except jwt.InvalidTokenError as exc:
        raise InvalidToken("the token is not valid") from exc
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject.strip() or len(subject) > 255:
        raise InvalidToken("the token's subject must be a non-empty string")
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
