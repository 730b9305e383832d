"""OpenTelemetry tracing, off unless configured.

One trace follows a job: the API request's span → the outbox row (W3C `traceparent` in the
envelope, written by registration) → the relay's publish span (its context in the AMQP
headers) → the worker's processing span.

Tracing is on when `TRACING_ENABLED=true` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set; spans go
to an OTLP/HTTP collector configured by the standard `OTEL_EXPORTER_OTLP_*` variables
(default `http://localhost:4318`), sampled by `OTEL_TRACES_SAMPLER` (default: always, or as
the parent says). Off, every helper here is a no-op and the SDK is never imported.

The provider is this module's own, not OpenTelemetry's global one: a process (or a test)
can switch tracing on and off again, which the global provider does not allow.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

    from san_common.settings import ServiceSettings

log = logging.getLogger(__name__)

_TRACE_KEYS = ("traceparent", "tracestate")
_KINDS = {
    "server": trace.SpanKind.SERVER,
    "producer": trace.SpanKind.PRODUCER,
    "consumer": trace.SpanKind.CONSUMER,
    "internal": trace.SpanKind.INTERNAL,
}
SpanKindName = Literal["server", "producer", "consumer", "internal"]

_provider: TracerProvider | None = None
_tracer: trace.Tracer = trace.NoOpTracer()


def tracing_wanted(settings: ServiceSettings) -> bool:
    return settings.tracing_enabled or bool(settings.otel_exporter_otlp_endpoint)


def configure_tracing(
    settings: ServiceSettings, *, exporter: SpanExporter | None = None, batch: bool = True
) -> bool:
    """Switch tracing on if the settings ask for it (or an exporter is given); returns
    whether it is on. Tests pass an in-memory exporter and `batch=False`."""
    global _provider, _tracer
    if exporter is None and not tracing_wanted(settings):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:  # the `tracing` extra is not installed (`make run` leaves it out)
        log.warning(
            "tracing requested but not installed (the `tracing` extra: "
            "uv sync --extra tracing, or the images); tracing off"
        )
        return False
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    shutdown_tracing()
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    _provider, _tracer = provider, provider.get_tracer("san")
    _instrument(provider)
    log.info("tracing on")
    return True


# The libraries' own instrumentations, under SAN's spans: every PostgreSQL statement
# (asyncpg), every outgoing HTTP call (httpx: the AI server, GitHub) and every AMQP publish
# and delivery (aio-pika). The API's server span and the relay's and worker's job spans
# stay SAN's own (`span` below): they carry the job's ids and its trace through the outbox.
_INSTRUMENTATIONS = (
    ("opentelemetry.instrumentation.asyncpg", "AsyncPGInstrumentor"),
    ("opentelemetry.instrumentation.httpx", "HTTPXClientInstrumentor"),
    ("opentelemetry.instrumentation.aio_pika", "AioPikaInstrumentor"),
)
_instrumented: list[Any] = []


def _instrument(provider: TracerProvider) -> None:
    for module, name in _INSTRUMENTATIONS:
        try:
            instrumentor = getattr(importlib.import_module(module), name)()
        except ImportError:  # the `tracing` extra without this one: SAN's spans only
            log.warning("tracing without %s: not installed", module)
            continue
        instrumentor.instrument(tracer_provider=provider)
        _instrumented.append(instrumentor)


def _uninstrument() -> None:
    while _instrumented:
        _instrumented.pop().uninstrument()


def enabled() -> bool:
    return _provider is not None


def shutdown_tracing() -> None:
    """Flush pending spans and switch tracing off."""
    global _provider, _tracer
    provider, _provider, _tracer = _provider, None, trace.NoOpTracer()
    _uninstrument()
    if provider is not None:
        provider.shutdown()


# Every span while tracing is off: one object, entered by every request and job.
_NO_SPAN: contextlib.nullcontext[trace.Span] = contextlib.nullcontext(trace.INVALID_SPAN)


def span(
    name: str,
    *,
    kind: SpanKindName = "internal",
    parent: Mapping[str, Any] | None = None,
    attributes: Mapping[str, str | int | float | bool] | None = None,
) -> AbstractContextManager[trace.Span]:
    """A span made current for the block. `parent` is a carrier (an envelope, message
    headers, HTTP headers) whose `traceparent` becomes this span's parent."""
    if _provider is None:  # off: no context parsing, no span
        return _NO_SPAN
    ctx = context_from(parent) if parent is not None else None
    return _tracer.start_as_current_span(
        name, context=ctx, kind=_KINDS[kind], attributes=dict(attributes or {})
    )


def current_trace_context() -> dict[str, str]:
    """The W3C `traceparent`/`tracestate` of the current span; empty when none is active
    (always, with tracing off: no span is ever made current then)."""
    if _provider is None:
        return {}
    carrier: dict[str, str] = {}
    inject(carrier)
    return {k: v for k, v in carrier.items() if k in _TRACE_KEYS}


def context_from(carrier: Mapping[str, Any]) -> otel_context.Context:
    """The context a carrier's `traceparent`/`tracestate` describe (empty if it has none)."""
    return extract({k: str(v) for k, v in carrier.items() if k.lower() in _TRACE_KEYS and v})


def current_trace_id() -> str | None:
    """The 32-hex-digit trace id of the current span, for log lines; None outside a trace
    (always, with tracing off)."""
    if _provider is None:
        return None
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id inside a `traceparent` value (`00-<trace id>-<span id>-<flags>`)."""
    if traceparent and traceparent.count("-") == 3:
        return traceparent.split("-")[1]
    return None


def annotate(**attributes: str | int | float | bool) -> None:
    """Add `san.<name>` attributes to the current span (nothing when tracing is off)."""
    current = trace.get_current_span()
    if current.is_recording():
        for name, value in attributes.items():
            current.set_attribute(f"san.{name}", value)


def flush(timeout_seconds: float = 5.0) -> None:
    """Export the spans still buffered (at shutdown, when the process may end abruptly)."""
    if _provider is not None:
        _provider.force_flush(int(timeout_seconds * 1000))
