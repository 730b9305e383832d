"""Admin sweeps: a "run now" request shows how often a recovery process took it and why
it ended unrun, when it did (docs/operations.md, "run now")."""

from __future__ import annotations

import httpx
from sqlalchemy import insert

from san_common.models import SweepRequest
from tests.admin.support import Sessions, operator_headers

OP = operator_headers()


async def test_a_request_shows_its_takings_and_why_it_ended_unrun(
    api: httpx.AsyncClient, sessions: Sessions
) -> None:
    asked = await api.post("/admin/api/sweeps/run", json={"sweeps": ["ghost"]}, headers=OP)
    assert asked.status_code == 202, asked.text
    assert (asked.json()["attempts"], asked.json()["error"]) == (0, None)
    error = "not run again: taken 5 times, never finished"
    async with sessions() as session, session.begin():
        await session.execute(
            insert(SweepRequest).values(
                sweeps=["retention"], requested_by="op", attempts=6, ok=False, error=error
            )
        )

    listed = await api.get("/admin/api/sweeps", headers=OP)

    assert listed.status_code == 200, listed.text
    requests = {tuple(q["sweeps"]): q for q in listed.json()["requests"]}
    assert (requests[("ghost",)]["attempts"], requests[("ghost",)]["error"]) == (0, None)
    given_up = requests[("retention",)]
    assert (given_up["attempts"], given_up["ok"], given_up["error"]) == (6, False, error)
