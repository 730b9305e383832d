"""Request dependencies. The session dependency owns the transaction: it commits when the
endpoint returns (before the response is sent) and rolls back when it raises, so a request
writes all or nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.ext.asyncio import AsyncSession

from san_api.auth.tokens import InvalidToken, TokenVerifier
from san_api.errors import AppError, Unauthorized
from san_api.settings import ApiSettings
from san_api.users import repository as users
from san_api.users.cache import ProvisionedUsers


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session:
        try:
            yield session
        except AppError as exc:
            # an error may have to keep what it wrote (a burnt OAuth state); none else does
            await (session.commit() if exc.keep_writes else session.rollback())
            raise
        except BaseException:
            await session.rollback()
            raise
        else:
            await session.commit()


async def get_settings(request: Request) -> ApiSettings:
    # async: FastAPI runs a plain `def` dependency in a worker thread, for every request
    settings: ApiSettings = request.app.state.settings
    return settings


# scope="function": commit when the endpoint returns, *before* the response is sent (the
# default, "request", commits after it), so a 202 is only ever sent for committed rows.
SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]
SettingsDep = Annotated[ApiSettings, Depends(get_settings)]

_bearer = HTTPBearer(auto_error=False)


@dataclass(frozen=True)
class Principal:
    user_id: uuid.UUID
    external_id: str


async def get_subject(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The verified token's subject; needs no database (the rate limiter runs on it)."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Unauthorized("Missing bearer token: send 'Authorization: Bearer <token>'")
    verifier: TokenVerifier = request.app.state.tokens
    try:
        return await verifier.verify(credentials.credentials)
    except InvalidToken as exc:
        raise Unauthorized(f"Invalid bearer token: {exc}") from exc


SubjectDep = Annotated[str, Depends(get_subject)]


async def get_current_user(request: Request, session: SessionDep, subject: SubjectDep) -> Principal:
    known: ProvisionedUsers = request.app.state.provisioned_users
    user_id = known.get(subject)
    if user_id is None:  # the session connects only here, on a subject not seen before
        user_id, created = await users.provision(session, subject)
        if not created:  # committed already; one created now is remembered next time
            known.remember(subject, user_id)
    return Principal(user_id, subject)


CurrentUser = Annotated[Principal, Depends(get_current_user)]
