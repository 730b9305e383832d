"""`/docs` is served by the API itself: it renders in a headless Chromium that can reach
nothing but the API (a screenshot is saved), under the page's CSP; and it is off under
SAN_ENV=production unless API_DOCS_ENABLED turns it on."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from san_api import edge
from san_api.app import create_app
from san_api.settings import ApiSettings
from tests.api.support import api_with, over_http
from tests.conftest import JWT_SECRET, TOKEN_KEYS

ARTIFACTS = Path(os.environ.get("SAN_TEST_ARTIFACTS", Path(__file__).parents[2] / ".artifacts"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# production refuses placeholder passwords; these pages need neither server
PRODUCTION = {
    "database_url": "postgresql://san:not-a-placeholder@127.0.0.1:9/san",
    "amqp_url": "amqp://san:not-a-placeholder@127.0.0.1:9/",
    "auth_jwt_secret": JWT_SECRET,
    "token_encryption_keys": TOKEN_KEYS,
}


@pytest.mark.parametrize(
    ("overrides", "served"),
    [
        ({"san_env": "production"}, False),
        ({"san_env": "production", "api_docs_enabled": True}, True),
        ({"api_docs_enabled": False}, False),
        ({}, True),
    ],
)
async def test_docs_are_off_in_production_unless_turned_on(
    settings_for: Any, overrides: dict[str, object], served: bool
) -> None:
    if overrides.get("san_env") == "production":
        settings = ApiSettings(**{**PRODUCTION, **overrides})  # type: ignore[arg-type]
    else:
        settings = settings_for(**overrides)
    async with api_with(settings) as api:
        for path in ("/docs", "/openapi.json", "/docs/static/swagger-ui-bundle.js"):
            response = await api.get(path)
            assert response.status_code == (200 if served else 404), path
        assert (await api.get("/redoc")).status_code == 404  # not offered (docs.py says why)


async def test_the_docs_pages_and_assets_come_from_the_api(settings_for: Any) -> None:
    async with api_with(settings_for()) as api:
        page = await api.get("/docs")
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == edge.PAGE_CSP
        assert "http" not in page.text  # no absolute URL: nothing from elsewhere
        for asset in ("swagger-ui.css", "swagger-ui-bundle.js"):
            assert (await api.get(f"/docs/static/{asset}")).status_code == 200
        init = await api.get("/docs/swagger-init.js")
        assert init.headers["content-type"].startswith("text/javascript")


def _render(base_url: str, shots: Path) -> dict[str, Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    shots.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,2000",
        # no network but the API: every other host name fails to resolve, and no proxy
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        "--no-proxy-server",
        "--disable-background-networking",
        "--disable-component-update",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        driver.get(f"{base_url}/docs")
        WebDriverWait(driver, 90).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock")) >= 20
        )
        title = driver.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text
        operations = len(driver.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock"))
        driver.save_screenshot(str(shots / "docs-swagger-ui.png"))
        resources = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
        logs = [entry["message"] for entry in driver.get_log("browser")]

        return {"title": title, "operations": operations, "resources": resources, "logs": logs}
    finally:
        driver.quit()


@pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs chromium and chromedriver (apt-get install -y chromium chromium-driver; "
    ".ci/run installs them)",
)
async def test_docs_render_in_headless_chromium_without_network(settings_for: Any) -> None:
    settings = settings_for()
    async with over_http(create_app(settings), **edge.server_options(settings)) as base_url:
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{base_url}/healthz")).status_code == 200
        seen = await asyncio.to_thread(_render, base_url, ARTIFACTS)
    assert seen["title"].startswith("SAN API"), seen["title"]
    assert seen["operations"] >= 20
    elsewhere = [r for r in seen["resources"] if not r.startswith(base_url)]
    assert seen["resources"] and not elsewhere, elsewhere
    blocked = [line for line in seen["logs"] if "Content Security Policy" in line]
    assert not blocked, blocked
    assert (ARTIFACTS / "docs-swagger-ui.png").stat().st_size > 10_000
