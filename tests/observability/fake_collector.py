"""A fake OpenTelemetry collector: OTLP/HTTP (protobuf) `POST /v1/traces` on loopback,
keeping every span it receives. The services' real exporter sends to it."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.fakes.loopback import LoopbackHTTPServer, LoopbackServer


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span


class FakeCollector(LoopbackServer):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        super().__init__(_Handler)

    @property
    def endpoint(self) -> str:
        return self.origin

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        received = []
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service,
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                        )
                    )
        with self._lock:
            self._spans.extend(received)


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackHTTPServer[FakeCollector]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        self.server.fake.receive(body)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        pass
