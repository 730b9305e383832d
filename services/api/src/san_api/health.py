from __future__ import annotations

import asyncio

import aio_pika
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: answers as soon as the process serves requests; checks no dependency."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready: the database and the broker are reachable."""
    checks: dict[str, str] = {}
    try:
        async with request.app.state.engine.connect() as connection:
            await asyncio.wait_for(connection.execute(text("SELECT 1")), timeout=3)
        checks["database"] = "ok"
    except Exception as exc:  # a probe reports failures, it never raises them
        checks["database"] = type(exc).__name__
    try:
        connection = await aio_pika.connect(request.app.state.settings.amqp_url, timeout=3)
        await connection.close()
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = type(exc).__name__
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ready" if ready else "not ready", "checks": checks}, 200 if ready else 503
    )


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
