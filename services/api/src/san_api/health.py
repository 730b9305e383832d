"""`/healthz` (alive), `/readyz` (able to accept work), `/metrics`.

The API is ready when PostgreSQL answers: a job and its outbox row are committed together,
so a broker outage delays publishing, never accepting (docs/reference/job-rules.md §7). The broker's
state is in `/readyz`'s body and in `san_dependency_up{dependency="broker"}`, read from the one
connection the API keeps open for that (`BrokerMonitor`), never from a connection per probe.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from san_common.probes import Report

router = APIRouter(tags=["health"])

# Answered even beyond the connection cap (san_api.edge): a flood of user connections must
# not make the orchestrator restart a healthy process or take it out of service.
PROBE_PATHS = frozenset({"/healthz", "/readyz"})


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: answers as soon as the process serves requests; checks no dependency."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        503: {
            "description": "PostgreSQL is unreachable: the API cannot accept work",
            "content": {"application/json": {}},
        }
    },
)
async def readyz(request: Request) -> Response:
    """Ready: PostgreSQL answers. `checks.broker` shows RabbitMQ's state but never fails
    this probe: the outbox holds jobs while the broker is away."""
    report: Report = await request.app.state.readiness()
    return Response(
        report.body(), status_code=200 if report.ready else 503, media_type="application/json"
    )


@router.get("/metrics", include_in_schema=False)
async def metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
