from __future__ import annotations

from fastapi import APIRouter

from san_api.deps import CurrentUser, SessionDep
from san_api.users import repository
from san_api.users.schemas import Me, MeUpdate

router = APIRouter(tags=["me"])


async def _me(session: SessionDep, user: CurrentUser) -> Me:
    row = await repository.get(session, user.user_id)
    assert row is not None  # provisioned by CurrentUser in this transaction
    return Me(
        userId=row.id, externalId=row.external_id, timezone=row.timezone, createdAt=row.created_at
    )


@router.get("/me", response_model=Me)
async def get_me(user: CurrentUser, session: SessionDep) -> Me:
    """The caller's profile."""
    return await _me(session, user)


@router.patch("/me", response_model=Me)
async def update_me(body: MeUpdate, user: CurrentUser, session: SessionDep) -> Me:
    """Set the caller's time zone (TIL days and the daily batch follow it)."""
    await repository.set_timezone(session, user.user_id, body.timezone)
    return await _me(session, user)
