"""One access-log line per request (method, route template, status, duration, request id),
probes at DEBUG, and a request id that is echoed and bound to the request's log lines."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import pytest


def _access(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "san_api.access"]


async def test_one_access_line_per_request_with_the_route_template(
    api: httpx.AsyncClient,
    new_user: Callable[[], dict[str, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    headers = new_user()
    caplog.set_level(logging.DEBUG, logger="san_api.access")
    accepted = await api.post("/scraps", json={"content": "access log"}, headers=headers)
    missing = await api.get(f"/async-jobs/{'0' * 8}-0000-0000-0000-{'0' * 12}", headers=headers)
    assert accepted.status_code == 202 and missing.status_code == 404
    first, second = _access(caplog)
    assert first.levelno == logging.INFO
    fields = first.fields  # type: ignore[attr-defined]
    assert fields["method"] == "POST" and fields["route"] == "/scraps"
    assert fields["status"] == 202 and fields["duration_ms"] >= 0
    assert second.fields["route"] == "/async-jobs/{jobId}"  # type: ignore[attr-defined]
    assert second.fields["status"] == 404  # type: ignore[attr-defined]
    assert accepted.headers["x-request-id"] != missing.headers["x-request-id"]


async def test_the_callers_request_id_is_echoed_when_sane_and_bound_to_the_line(
    api: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    from san_common.logs import _bound

    caplog.set_level(logging.DEBUG, logger="san_api.access")
    seen: list[dict[str, object]] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(dict(_bound()))  # type: ignore[method-assign]
    logging.getLogger("san_api.access").addHandler(handler)
    try:
        kept = await api.get("/healthz", headers={"X-Request-ID": "req-42.a:b"})
        replaced = await api.get("/healthz", headers={"X-Request-ID": "no spaces allowed"})
    finally:
        logging.getLogger("san_api.access").removeHandler(handler)
    assert kept.headers["x-request-id"] == "req-42.a:b"
    assert replaced.headers["x-request-id"] != "no spaces allowed"
    assert [s["request_id"] for s in seen] == ["req-42.a:b", replaced.headers["x-request-id"]]


async def test_probes_log_at_debug_and_unmatched_paths_show_the_path(
    api: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="san_api.access")
    await api.get("/readyz")
    await api.get("/no/such/thing")
    probe, unmatched = _access(caplog)
    assert probe.levelno == logging.DEBUG
    assert unmatched.levelno == logging.INFO
    assert unmatched.fields["route"] == "unmatched"  # type: ignore[attr-defined]
    assert unmatched.fields["path"] == "/no/such/thing"  # type: ignore[attr-defined]
