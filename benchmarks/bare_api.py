"""The baseline of `POST /scraps`: a bare FastAPI + asyncpg endpoint doing the same work
in the same one transaction — verify the HS256 bearer token, normalise, hash, insert the
scrap (ON CONFLICT per user and hash), register CARD_ANALYSIS and SCRAP_REFINE (job row +
outbox row with the JSON envelope each) — and answer 202 with the same body. No ORM, no
dependency chain, no middleware: what the transaction costs from Python on this machine.

    BENCH_DATABASE_URL=… BENCH_JWT_SECRET=… uvicorn benchmarks.bare_api:app
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import asyncpg
import jwt
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response

_INSERT_SCRAP = (
    "INSERT INTO scraps (id, user_id, content, content_hash) VALUES ($1, $2, $3, $4) "
    "ON CONFLICT (user_id, content_hash) DO NOTHING RETURNING id"
)
_INSERT_JOB = (
    "INSERT INTO async_jobs (job_id, job_type, target_id, user_id, attempt) "
    "VALUES ($1, $2, $3, $4, 1)"
)
_INSERT_OUTBOX = (
    "INSERT INTO outbox_messages (message_id, exchange, routing_key, body, headers) "
    "VALUES ($1, 'jobs', $2, $3::jsonb, '{}'::jsonb)"
)
_USER = (
    "INSERT INTO users (external_id) VALUES ($1) ON CONFLICT (external_id) "
    "DO UPDATE SET external_id = excluded.external_id RETURNING id"
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.pool = await asyncpg.create_pool(
        os.environ["BENCH_DATABASE_URL"], min_size=10, max_size=10
    )
    app.state.users = {}
    yield
    await app.state.pool.close()


app = FastAPI(lifespan=lifespan)
SECRET = os.environ.get("BENCH_JWT_SECRET", "")


@app.post("/scraps", status_code=202)
async def create_scrap(request: Request, authorization: str = Header()) -> Response:
    subject = jwt.decode(authorization.removeprefix("Bearer "), SECRET, algorithms=["HS256"])["sub"]
    content = (await request.json())["content"].replace("\r\n", "\n").strip()
    digest = hashlib.sha256(content.encode()).hexdigest()
    async with request.app.state.pool.acquire() as connection, connection.transaction():
        user_id = request.app.state.users.get(subject)
        if user_id is None:
            user_id = request.app.state.users[subject] = await connection.fetchval(_USER, subject)
        scrap_id = await connection.fetchval(_INSERT_SCRAP, uuid.uuid4(), user_id, content, digest)
        job_ids = []
        for job_type in ("CARD_ANALYSIS", "SCRAP_REFINE"):
            job_id, message_id = uuid.uuid4(), uuid.uuid4()
            await connection.execute(_INSERT_JOB, job_id, job_type, scrap_id, user_id)
            envelope = {
                "version": 1,
                "message_id": str(message_id),
                "job_id": str(job_id),
                "job_type": job_type,
                "target_id": str(scrap_id),
                "user_id": str(user_id),
                "attempt": 1,
                "created_at": datetime.now(UTC).isoformat(),
                "traceparent": None,
                "tracestate": None,
            }
            await connection.execute(_INSERT_OUTBOX, message_id, job_type, json.dumps(envelope))
            job_ids.append(str(job_id))
    return JSONResponse(
        {
            "scrapId": str(scrap_id),
            "analysisJobId": job_ids[0],
            "refineJobId": job_ids[1],
            "duplicate": False,
        },
        status_code=202,
    )
