"""The maintenance service's request-state cleanup (docs/security.md, "Rate limits and
quotas"): rate-limit buckets idle longer than any refill takes, and OAuth states used or
expired, are deleted in bounded batches; live ones stay."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_common.models import GithubOAuthState, RateLimitBucket
from san_recovery import request_state
from tests.admin.support import new_user

Sessions = async_sessionmaker[AsyncSession]


async def test_idle_buckets_and_spent_oauth_states_go_and_live_ones_stay(
    db: Sessions, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    user_id, _ = await new_user(db)
    idle = [(f"idle-{i}", "scraps", now - timedelta(days=2)) for i in range(25)]
    live = [
        ("busy", "scraps", now - timedelta(minutes=5)),
        ("busy", "til", now - timedelta(hours=20)),
    ]
    states = {
        "expired": (now - timedelta(days=1), None),
        "used": (now + timedelta(minutes=5), now - timedelta(minutes=1)),
        "pending": (now + timedelta(minutes=5), None),
    }
    async with db() as session, session.begin():
        rows = [*idle, *live]
        await session.execute(
            insert(RateLimitBucket),
            [{"subject": s, "bucket": b, "tokens": 3.0, "updated_at": at} for s, b, at in rows],
        )
        await session.execute(
            insert(GithubOAuthState),
            [
                {"state_hash": name.ljust(64, "0"), "user_id": user_id,
                 "encrypted_code_verifier": "x", "expires_at": expires, "used_at": used}
                for name, (expires, used) in states.items()
            ],
        )  # fmt: skip

    monkeypatch.setattr(request_state, "BATCH", 10)  # three batches for the buckets
    assert await request_state.clean(db) == (25, 2)

    async with db() as session:
        buckets = (
            await session.execute(select(RateLimitBucket.subject, RateLimitBucket.bucket))
        ).all()
        kept = (await session.scalars(select(GithubOAuthState.state_hash))).all()
    assert sorted(buckets) == [("busy", "scraps"), ("busy", "til")]
    assert kept == ["pending".ljust(64, "0")]
    assert await request_state.clean(db) == (0, 0)
