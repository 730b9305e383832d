"""Probes, docs and metrics (docs/reference/job-rules.md §7): served without a token."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from san_api.settings import ApiSettings
from tests import infra
from tests.api.support import api_with
from tests.conftest import api_settings


async def test_healthz(api: httpx.AsyncClient) -> None:
    response = await api.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_checks_database_and_reports_the_broker(api: httpx.AsyncClient) -> None:
    response = await api.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ready", "checks": {"database": "up", "broker": "up"}}


async def test_readyz_stays_ready_when_the_broker_is_unreachable(
    settings_for: Callable[..., ApiSettings],
) -> None:
    """The outbox absorbs a broker outage: the API keeps accepting work (docs/reference/job-rules.md
    §7)."""
    dead_broker = f"amqp://guest:guest@127.0.0.1:{infra.free_port()}/"
    async with api_with(settings_for(amqp_url=dead_broker)) as client:
        response = await client.get("/readyz")
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready"
    assert body["checks"] == {"database": "up", "broker": "down"}
    assert 'san_dependency_up{dependency="broker"} 0.0' in metrics


async def test_readyz_is_503_when_postgresql_is_unreachable(amqp_url: str) -> None:
    dead_database = f"postgresql://san:pw@127.0.0.1:{infra.free_port()}/san"
    async with api_with(api_settings(dead_database, amqp_url)) as client:
        response = await client.get("/readyz")
    assert response.status_code == 503, response.text
    assert response.json()["checks"]["database"] == "down"


async def test_openapi_documents_the_endpoints(api: httpx.AsyncClient) -> None:
    response = await api.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/scraps",
        "/async-jobs/{jobId}",
        "/cards/{scrapId}",
        "/cards/{cardId}/similar-cards",
        "/healthz",
        "/readyz",
    ):
        assert path in paths, sorted(paths)


async def test_docs_page(api: httpx.AsyncClient) -> None:
    response = await api.get("/docs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in response.text


def _count(metrics: str, method: str, route: str, status: str) -> float:
    wanted = {"method": method, "route": route, "status": status}
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "san_http_requests_total" and sample.labels == wanted:
                return float(sample.value)
    return 0.0


async def test_metrics_count_requests_by_route_template(
    api: httpx.AsyncClient, new_user: Callable[[], dict[str, str]]
) -> None:
    headers = new_user()
    job_id = uuid.uuid4()
    before = (await api.get("/metrics")).text
    assert "san_http_requests_total" in before

    for _ in range(3):
        assert (await api.get(f"/async-jobs/{job_id}", headers=headers)).status_code == 404

    after = await api.get("/metrics")
    assert after.status_code == 200
    assert after.headers["content-type"].startswith("text/plain")
    route = "/async-jobs/{jobId}"
    assert _count(after.text, "GET", route, "404") - _count(before, "GET", route, "404") == 3
    assert str(job_id) not in after.text  # raw paths would explode the label cardinality
