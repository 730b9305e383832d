"""Helpers of the API suite: problem+json checks, per-user row counts, direct card inserts,
and the API served in-process (ASGI) or over real HTTP (uvicorn)."""

from __future__ import annotations

import asyncio
import hashlib
import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
import uvicorn
from fastapi import FastAPI
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_api.app import create_app
from san_api.settings import ApiSettings
from san_common.models import AsyncJob, KnowledgeCard, OutboxMessage, Scrap, User
from san_common.models.base import EMBEDDING_DIMENSIONS
from tests import infra
from tests.waiting import eventually

PROBLEM_JSON = "application/problem+json"
Sessions = async_sessionmaker[AsyncSession]


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status and stable code."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].split(";")[0].strip() == PROBLEM_JSON
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert isinstance(body["title"], str) and body["title"].strip()
    assert isinstance(body["detail"], str) and body["detail"].strip()
    return body


def subject_of(headers: dict[str, str]) -> str:
    """The `sub` of the bearer token in these headers (the user's external id)."""
    token = headers["Authorization"].removeprefix("Bearer ")
    subject: str = jwt.decode(token, options={"verify_signature": False})["sub"]
    return subject


@dataclass(frozen=True)
class Footprint:
    """What one user has in the database."""

    users: int
    scraps: int
    jobs: int
    outbox: int


async def footprint(sessions: Sessions, subject: str) -> Footprint:
    async with sessions() as session:
        users = await session.scalar(
            select(func.count()).select_from(User).where(User.external_id == subject)
        )
        user_id = await session.scalar(select(User.id).where(User.external_id == subject))
        if user_id is None:
            return Footprint(users=int(users or 0), scraps=0, jobs=0, outbox=0)
        scraps = await session.scalar(
            select(func.count()).select_from(Scrap).where(Scrap.user_id == user_id)
        )
        jobs = await session.scalar(
            select(func.count()).select_from(AsyncJob).where(AsyncJob.user_id == user_id)
        )
        outbox = await session.scalar(
            select(func.count())
            .select_from(OutboxMessage)
            .where(OutboxMessage.body["user_id"].astext == str(user_id))
        )
        return Footprint(int(users or 0), int(scraps or 0), int(jobs or 0), int(outbox or 0))


async def user_id_of(sessions: Sessions, subject: str) -> uuid.UUID:
    async with sessions() as session:
        user_id: uuid.UUID | None = await session.scalar(
            select(User.id).where(User.external_id == subject)
        )
    assert user_id is not None, f"user {subject!r} was not provisioned"
    return user_id


async def save_scrap(
    api: httpx.AsyncClient, headers: dict[str, str], content: str | None = None
) -> dict[str, Any]:
    """POST /scraps (unique content unless given) and return the 202 body."""
    content = content if content is not None else f"scrap {uuid.uuid4()}"
    response = await api.post("/scraps", json={"content": content}, headers=headers)
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


async def jobs_of_target(sessions: Sessions, target_id: uuid.UUID | str) -> list[AsyncJob]:
    async with sessions() as session:
        result = await session.scalars(
            select(AsyncJob)
            .where(AsyncJob.target_id == uuid.UUID(str(target_id)))
            .order_by(AsyncJob.created_at)
        )
        return list(result)


def embedding_at(distance: float, axis: int) -> list[float]:
    """A unit vector at this cosine distance from e0, tilted towards `axis` (≥ 1)."""
    assert 0 <= distance <= 2 and 1 <= axis < EMBEDDING_DIMENSIONS
    cosine = 1.0 - distance
    vector = [0.0] * EMBEDDING_DIMENSIONS
    vector[0] = cosine
    vector[axis] = math.sqrt(max(0.0, 1.0 - cosine * cosine))
    return vector


@dataclass(frozen=True)
class InsertedCard:
    card_id: uuid.UUID
    scrap_id: uuid.UUID


async def insert_card(
    sessions: Sessions,
    user_id: uuid.UUID,
    embedding: list[float],
    *,
    scrap_id: uuid.UUID | None = None,
    title: str = "card",
) -> InsertedCard:
    """A knowledge card as CARD_ANALYSIS would store it (and its scrap, unless given)."""
    async with sessions() as session, session.begin():
        if scrap_id is None:
            scrap_id = uuid.uuid4()
            content = f"{title} {scrap_id}"
            session.add(
                Scrap(
                    id=scrap_id,
                    user_id=user_id,
                    content=content,
                    content_hash=hashlib.sha256(content.encode()).hexdigest(),
                )
            )
            await session.flush()
        card_id = uuid.uuid4()
        session.add(
            KnowledgeCard(
                id=card_id,
                user_id=user_id,
                scrap_id=scrap_id,
                title=title,
                summary=f"summary of {title}",
                embedding=embedding,
            )
        )
    return InsertedCard(card_id, scrap_id)


@asynccontextmanager
async def in_process(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan, behind an in-process ASGI client."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            yield client


@asynccontextmanager
async def api_with(settings: ApiSettings) -> AsyncIterator[httpx.AsyncClient]:
    async with in_process(create_app(settings)) as client:
        yield client


@asynccontextmanager
async def over_http(
    app: FastAPI, *, start_timeout: float = 30.0, **options: Any
) -> AsyncIterator[str]:
    """Serve the app with uvicorn on a free loopback port; yields its base URL. `options`
    go to uvicorn (e.g. `san_api.edge.server_options(settings)`, as `san-api` runs it)."""
    port = infra.free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        lifespan="on",
        log_config=None,
        timeout_graceful_shutdown=5,
        **{"http": "h11", "ws": "none", **options},
    )
    server = uvicorn.Server(config)

    async def started() -> bool:
        if task.done() and not server.started:
            task.result()  # surfaces the start-up error
            raise RuntimeError("uvicorn stopped before it started")
        return server.started

    task = asyncio.create_task(server.serve())
    try:
        await eventually(started, within=start_timeout, what="uvicorn to start", interval=0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=15)
