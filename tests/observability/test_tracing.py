"""One trace from the API request through the outbox row and the relay's publish to the
worker's processing, in one event loop with an in-memory span exporter."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_api.app import create_app
from san_common import tracing
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.models import OutboxMessage
from san_common.settings import ServiceSettings
from san_common.worker import RuntimeConfig, WorkerRuntime
from san_relay.relay import Relay
from san_relay.settings import RelaySettings
from tests.conftest import api_settings
from tests.waiting import eventually, settled_job

pytestmark = pytest.mark.rabbit


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.configure_tracing(
        ServiceSettings(service_name="test"), exporter=exporter, batch=False
    )
    try:
        yield exporter
    finally:
        tracing.shutdown_tracing()


@pytest.fixture
async def system(
    fresh_db_url: str, amqp_url: str, topology: Topology, spans: InMemorySpanExporter
) -> AsyncIterator[httpx.AsyncClient]:
    """API (ASGI, in-process), relay and ai-worker sharing this event loop."""
    engine = create_engine(fresh_db_url, pool_size=10)
    sessions = create_session_factory(engine)
    ai = build_provider("local")
    worker = WorkerRuntime(
        session_factory=sessions,
        amqp_url=amqp_url,
        topology=topology,
        handlers=build_handlers(ai),
        config=RuntimeConfig(prefetch=10, lease_seconds=30),
    )
    relay_settings = RelaySettings(
        database_url=fresh_db_url, amqp_url=amqp_url, amqp_prefix=topology.prefix
    )
    relay = Relay(relay_settings, sessions, topology)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)), asyncio.create_task(relay.run(stop))]
    app = create_app(api_settings(fresh_db_url, amqp_url))
    try:
        await asyncio.wait_for(worker.connected.wait(), 20)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                client.app_sessions = sessions  # type: ignore[attr-defined]
                yield client
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await ai.aclose()
        await engine.dispose()


def _hex(span: ReadableSpan) -> tuple[str, str | None]:
    assert span.context is not None
    parent = format(span.parent.span_id, "016x") if span.parent else None
    return format(span.context.span_id, "016x"), parent


async def test_one_post_scraps_is_one_trace_through_api_relay_and_worker(
    system: httpx.AsyncClient, spans: InMemorySpanExporter, new_user: Callable[[], dict[str, str]]
) -> None:
    response = await system.post(
        "/scraps", json={"content": f"Traced scrap {uuid.uuid4()}"}, headers=new_user()
    )
    assert response.status_code == 202, response.text
    body = response.json()
    for job_id in (body["analysisJobId"], body["refineJobId"]):
        job = await settled_job(system.app_sessions, job_id)  # type: ignore[attr-defined]
        assert job.status == "COMPLETED", job.error_message

    async def both_processed() -> bool:  # the worker acks, then its span ends
        consumers = [s for s in spans.get_finished_spans() if s.kind == SpanKind.CONSUMER]
        return len(consumers) >= 2

    await eventually(
        both_processed,
        within=10,
        what="both consumer spans",
        context=lambda: repr(spans.get_finished_spans()),
    )

    [request] = [s for s in spans.get_finished_spans() if s.name == "POST /scraps"]
    assert request.kind == SpanKind.SERVER and request.context is not None
    trace_id = request.context.trace_id
    whole_trace = [
        s for s in spans.get_finished_spans() if s.context and s.context.trace_id == trace_id
    ]
    in_trace = [s for s in whole_trace if _scope(s) == "san"]  # SAN's own spans
    publishes = [s for s in in_trace if s.kind == SpanKind.PRODUCER]
    consumers = [s for s in in_trace if s.kind == SpanKind.CONSUMER]
    assert sorted(s.name for s in publishes) == ["publish CARD_ANALYSIS", "publish SCRAP_REFINE"]
    assert sorted(s.name for s in consumers) == ["process CARD_ANALYSIS", "process SCRAP_REFINE"]
    request_id = _hex(request)[0]
    for publish in publishes:  # the outbox row carried the request's context
        assert _hex(publish)[1] == request_id
    everything = {_hex(s)[0]: s for s in whole_trace}

    def sans_parent(span: ReadableSpan) -> ReadableSpan:
        """The nearest ancestor of SAN's own (an instrumentation's span may sit between)."""
        parent = everything[_hex(span)[1]]  # type: ignore[index]
        return parent if _scope(parent) == "san" else sans_parent(parent)

    for consumer in consumers:  # the message headers carried the publish span's context
        parent = sans_parent(consumer)
        assert parent.kind == SpanKind.PRODUCER
        assert parent.name.split()[1] == consumer.name.split()[1]
        assert consumer.attributes is not None and consumer.attributes["san.outcome"] == "completed"
        assert consumer.attributes["san.job_id"] in (body["analysisJobId"], body["refineJobId"])

    async with system.app_sessions() as session:  # type: ignore[attr-defined]
        envelopes = (await session.scalars(select(OutboxMessage.body))).all()
    assert {e["traceparent"].split("-")[1] for e in envelopes} == {format(trace_id, "032x")}

    # the libraries' instrumentations add their spans under SAN's: the request's SQL, the
    # AMQP sends of the publishes, the worker's SQL
    library = [s for s in whole_trace if _scope(s) != "san"]
    database = [s for s in library if (s.attributes or {}).get("db.system") == "postgresql"]
    assert any(_hex(s)[1] == request_id for s in database), "the request's statements"
    sends = [s for s in library if s.kind == SpanKind.PRODUCER]
    assert {sans_parent(s).name for s in sends} == {
        "publish CARD_ANALYSIS",
        "publish SCRAP_REFINE",
    }
    consumer_ids = {_hex(s)[0] for s in consumers}
    assert any(_hex(s)[1] in consumer_ids for s in database), "the worker's statements"


def _scope(span: ReadableSpan) -> str:
    return span.instrumentation_scope.name if span.instrumentation_scope else ""


async def test_the_api_continues_the_callers_trace(
    api: httpx.AsyncClient, spans: InMemorySpanExporter, new_user: Callable[[], dict[str, str]]
) -> None:
    caller_trace = uuid.uuid4().hex
    headers = {**new_user(), "traceparent": f"00-{caller_trace}-{'ab' * 8}-01"}
    response = await api.get(f"/async-jobs/{uuid.uuid4()}", headers=headers)
    assert response.status_code == 404
    [request] = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert request.context is not None and format(request.context.trace_id, "032x") == caller_trace
    assert request.name == "GET /async-jobs/{jobId}"  # the route, never the raw path
    assert request.attributes is not None and request.attributes["http.response.status_code"] == 404


async def test_with_tracing_off_nothing_is_carried(
    api: httpx.AsyncClient,
    sessions: async_sessionmaker[AsyncSession],
    new_user: Callable[[], dict[str, str]],
) -> None:
    assert tracing.current_trace_id() is None
    response = await api.post(
        "/scraps", json={"content": f"Untraced {uuid.uuid4()}"}, headers=new_user()
    )
    assert response.status_code == 202
    job_id = uuid.UUID(response.json()["analysisJobId"])
    async with sessions() as session:
        envelope = await session.scalar(
            select(OutboxMessage.body).where(OutboxMessage.body["job_id"].astext == str(job_id))
        )
    assert envelope is not None and envelope["traceparent"] is None
