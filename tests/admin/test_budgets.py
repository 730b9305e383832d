"""An operator sets a user's AI budget through the admin API, audited; users cannot."""

from __future__ import annotations

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.models import AdminAudit, UserBudget
from tests.admin.support import new_user, operator_headers, user_headers


async def test_an_operator_sets_a_users_budget_and_it_is_audited(
    api: httpx.AsyncClient, sessions: async_sessionmaker[AsyncSession]
) -> None:
    user_id, subject = await new_user(sessions)
    url = f"/admin/api/users/{user_id}/budget"
    refused = await api.put(url, json={"tokensPerDay": 5}, headers=user_headers(subject))
    assert refused.status_code == 403, refused.text

    response = await api.put(
        url, json={"tokensPerDay": 5000, "usdPerMonth": "2.5"}, headers=operator_headers("ops")
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"userId": str(user_id), "tokensPerDay": 5000, "usdPerMonth": 2.5}
    async with sessions() as session:
        row = await session.get(UserBudget, user_id)
        audit = await session.scalar(select(AdminAudit).where(AdminAudit.action == "user.budget"))
    assert row is not None and row.tokens_per_day == 5000 and row.updated_by == "ops"
    assert audit is not None and audit.actor == "ops" and audit.target == str(user_id)

    # Null keeps the default (unlimited in these settings); bad input is a 400, not a 500.
    default = await api.put(url, json={"tokensPerDay": None}, headers=operator_headers("ops"))
    assert default.json()["tokensPerDay"] == 0
    bad = await api.put(url, json={"tokensPerDay": -1}, headers=operator_headers("ops"))
    assert bad.status_code == 400, bad.text
    missing = await api.put(
        "/admin/api/users/00000000-0000-0000-0000-000000000000/budget",
        json={"tokensPerDay": 1},
        headers=operator_headers("ops"),
    )
    assert missing.status_code == 404, missing.text
