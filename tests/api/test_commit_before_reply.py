"""A 202 means "saved": the transaction commits before the response goes out (SPEC §1, §2.3).

If the reply left first, a client polling its job at once could get 404, and a commit that
then failed would leave the client holding ids of rows that never existed. The probe below
looks at the database, over another connection, at the moment the app sends the body.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import httpx
from sqlalchemy import func, select
from starlette.types import Message, Receive, Scope, Send

from san_api.app import create_app
from san_api.settings import ApiSettings
from san_common.models import AsyncJob, OutboxMessage, Scrap
from tests.api.support import Sessions


async def test_post_scraps_commits_before_the_202_is_sent(
    settings_for: Callable[..., ApiSettings],
    sessions: Sessions,
    new_user: Callable[[], dict[str, str]],
) -> None:
    app = create_app(settings_for())
    seen: list[tuple[int, int, int]] = []

    async def probe(scope: Scope, receive: Receive, send: Send) -> None:
        async def observing_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                body = json.loads(message["body"])
                job_ids = [uuid.UUID(body["analysisJobId"]), uuid.UUID(body["refineJobId"])]
                async with sessions() as session:
                    scraps = await session.scalar(
                        select(func.count())
                        .select_from(Scrap)
                        .where(Scrap.id == uuid.UUID(body["scrapId"]))
                    )
                    jobs = await session.scalar(
                        select(func.count())
                        .select_from(AsyncJob)
                        .where(AsyncJob.job_id.in_(job_ids))
                    )
                    outbox = await session.scalar(
                        select(func.count())
                        .select_from(OutboxMessage)
                        .where(OutboxMessage.body["job_id"].astext.in_(map(str, job_ids)))
                    )
                seen.append((int(scraps or 0), int(jobs or 0), int(outbox or 0)))
            await send(message)

        await app(scope, receive, observing_send)

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=probe)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            response = await client.post(
                "/scraps", json={"content": f"committed {uuid.uuid4()}"}, headers=new_user()
            )

    assert response.status_code == 202, response.text
    assert seen == [(1, 2, 2)], "the 202 went out before its rows were committed"
