"""A 202 means "saved": the transaction commits before the response goes out
(docs/reference/job-rules.md §1, §2.3); a request that fails half-way takes back everything it
wrote.

If the reply left first, a client polling its job at once could get 404, and a commit that
then failed would leave the client holding ids of rows that never existed. The probe below
looks at the database, over another connection, at the moment the app sends the body.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import asyncpg
import httpx
from fastapi import Request
from sqlalchemy import func, select
from starlette.types import Message, Receive, Scope, Send

from san_api.app import create_app
from san_api.deps import SubjectDep
from san_api.limits.dependencies import LimitedTransaction
from san_api.scraps import repository as scraps
from san_api.settings import ApiSettings
from san_common.db.engine import plain_url
from san_common.models import AsyncJob, OutboxMessage, Scrap
from tests.api.support import Footprint, Sessions, assert_problem, footprint, subject_of


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


# A server-side failure at the request's last write, after the user, the scrap, the first
# job and its outbox row are in: any failure there (a constraint, a disk, a bug) looks alike.
_REFUSE_REFINE = """
CREATE FUNCTION refuse_refine() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.job_type = 'SCRAP_REFINE' THEN RAISE EXCEPTION 'refused by the test'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_refine BEFORE INSERT ON async_jobs
    FOR EACH ROW EXECUTE FUNCTION refuse_refine();
"""


async def test_a_post_scraps_that_fails_at_its_last_write_leaves_nothing_behind(
    api: httpx.AsyncClient,
    db_url: str,
    sessions: Sessions,
    new_user: Callable[[], dict[str, str]],
) -> None:
    headers = new_user()
    admin = await asyncpg.connect(plain_url(db_url))
    try:
        await admin.execute(_REFUSE_REFINE)
        failed = await api.post("/scraps", json={"content": "half written"}, headers=headers)
        assert_problem(failed, 500, "INTERNAL_ERROR")
        assert "refused by the test" not in failed.text
        nothing = Footprint(users=0, scraps=0, jobs=0, outbox=0)
        assert await footprint(sessions, subject_of(headers)) == nothing

        await admin.execute("DROP TRIGGER refuse_refine ON async_jobs")
        saved = await api.post("/scraps", json={"content": "half written"}, headers=headers)
        assert saved.status_code == 202, saved.text
        assert saved.json()["duplicate"] is False  # the first attempt left no scrap to match
        whole = Footprint(users=1, scraps=1, jobs=2, outbox=2)
        assert await footprint(sessions, subject_of(headers)) == whole
    finally:
        await admin.close()


async def test_an_error_after_a_write_on_the_connection_takes_the_write_back(
    settings_for: Callable[..., ApiSettings],
    sessions: Sessions,
    new_user: Callable[[], dict[str, str]],
) -> None:
    """Not a database error (PostgreSQL would refuse the commit of an aborted transaction by
    itself): a bug after the user and a scrap were written."""

    limits = LimitedTransaction("write-then-fail", 1)

    async def write_then_fail(request: Request, subject: SubjectDep) -> None:
        async with limits.open(request, subject) as job:
            await scraps.insert_if_absent(job.connection, job.user.user_id, "doomed", "0" * 64)
            raise RuntimeError("a bug after the first write")

    app = create_app(settings_for())
    app.add_api_route("/write-then-fail", write_then_fail, methods=["POST"])
    headers = new_user()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            assert_problem(
                await client.post("/write-then-fail", headers=headers), 500, "INTERNAL_ERROR"
            )
    nothing = Footprint(users=0, scraps=0, jobs=0, outbox=0)
    assert await footprint(sessions, subject_of(headers)) == nothing


async def test_a_connection_given_back_inside_its_transaction_comes_back_without_it(
    settings_for: Callable[..., ApiSettings],
    sessions: Sessions,
    new_user: Callable[[], dict[str, str]],
) -> None:
    """The API's asyncpg pool skips asyncpg's reset statement (its users keep no session
    state), but a transaction left open, as by a rollback cut short, is still rolled back
    before the connection serves anyone else."""
    app = create_app(settings_for())
    subject = subject_of(new_user())
    async with app.router.lifespan_context(app):
        pool: asyncpg.Pool = app.state.connections
        async with pool.acquire() as connection:
            await connection.execute("BEGIN")  # not asyncpg's managed transaction
            await connection.execute("INSERT INTO users (external_id) VALUES ($1)", subject)
            backend = await connection.fetchval("SELECT pg_backend_pid()")
        async with pool.acquire() as connection:
            assert await connection.fetchval("SELECT pg_backend_pid()") == backend
            assert not connection.is_in_transaction()
            state = await connection.fetchval(
                "SELECT state FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            )
            assert state == "active"
    assert await footprint(sessions, subject) == Footprint(users=0, scraps=0, jobs=0, outbox=0)
