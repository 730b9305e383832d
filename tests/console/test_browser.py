"""Acceptance 1: headless Chromium (Debian's, driven by Selenium and chromium-driver) signs
in as an operator, finds a job the fault-injected AI made FAILED, retries it from the page
and sees it become COMPLETED without reloading; re-drives a dead letter and sees the queue
counts change. A screenshot of every view goes to SCREENSHOTS.

Everything runs in this test's event loop: the ai-worker runtime and the relay (real
RabbitMQ), the fake AI, and the API under uvicorn; Selenium's blocking calls go to threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import aio_pika
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from san_ai_worker.ai.provider import build_provider
from san_ai_worker.handlers import build_handlers
from san_api.app import create_app
from san_common.broker.topology import Topology
from san_common.db.engine import create_engine, create_session_factory
from san_common.jobs.registration import register_job
from san_common.jobs.types import JobType
from san_common.models import AsyncJob, Scrap
from san_common.usage import AiCall, TryUsage, ledger
from san_common.worker import JobHandler
from tests.admin.support import Sessions, insert_jobs, new_user, operator_headers, user_headers
from tests.api.support import over_http
from tests.conftest import api_settings
from tests.fakes.fake_ai import FakeAiServer
from tests.faults.harness import seed
from tests.running import worker_and_relay
from tests.waiting import settled_job

pytestmark = pytest.mark.rabbit

# The folder this test writes its screenshots to (docs/operations.md shows a few of them).
SCREENSHOTS = Path(__file__).resolve().parents[2] / ".artifacts" / "console-screenshots"
CHROMEDRIVER = shutil.which("chromedriver")
WAIT = 45.0

webdriver = pytest.importorskip("selenium.webdriver")
if CHROMEDRIVER is None:  # .ci/run installs it; a developer machine may not have it
    pytest.skip("chromium-driver is not installed", allow_module_level=True)

from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser() -> AsyncIterator[WebDriver]:
    options = webdriver.ChromeOptions()
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver  # type: ignore[misc]
    finally:
        driver.quit()


class Page:
    """Selenium from async code: every blocking call in a thread."""

    def __init__(self, driver: WebDriver, base: str) -> None:
        self.driver, self.base = driver, base

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def open(self, path: str) -> None:
        await self.call(self.driver.get, self.base + path)

    async def text(self, css: str) -> str:
        element = await self.call(self.driver.find_element, By.CSS_SELECTOR, css)
        return str(await self.call(lambda: element.text))

    async def click(self, css: str) -> None:
        element = await self.call(self.driver.find_element, By.CSS_SELECTOR, css)
        await self.call(element.click)

    async def until(self, what: str, condition: Callable[[WebDriver], object]) -> None:
        def wait() -> None:
            WebDriverWait(
                self.driver,
                WAIT,
                poll_frequency=0.2,
                # htmx swaps the live part of the page: an element read a moment ago may be gone
                ignored_exceptions=(StaleElementReferenceException, NoSuchElementException),
            ).until(condition, what)

        await self.call(wait)

    async def shot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        await self.call(self.driver.save_screenshot, str(SCREENSHOTS / f"{name}.png"))

    async def mark(self) -> None:
        """A flag that only survives as long as the page is not reloaded."""
        await self.call(self.driver.execute_script, "window.__notReloaded = true;")

    async def not_reloaded(self) -> bool:
        return bool(await self.call(self.driver.execute_script, "return window.__notReloaded"))


def text_is(css: str, expected: str) -> Callable[[WebDriver], bool]:
    def check(driver: WebDriver) -> bool:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return bool(found) and found[0].text.strip() == expected

    return check


async def same_job_new_try(base: str, job_id: uuid.UUID, owner: str) -> None:
    """The retry kept the job id; its second try completed, and the owner sees it."""
    async with httpx.AsyncClient(base_url=base, timeout=WAIT) as client:
        detail = (await client.get(f"/admin/api/jobs/{job_id}", headers=operator_headers())).json()
        mine = (await client.get(f"/async-jobs/{job_id}", headers=user_headers(owner))).json()
    outcomes = [t["outcome"] for t in detail["tries"]]
    assert outcomes[0] == "failed" and outcomes[-1] == "completed", outcomes
    assert mine["status"] == "COMPLETED" and mine["tries"] == len(outcomes) >= 2


async def a_scrap(sessions: Sessions, user_id: uuid.UUID) -> uuid.UUID:
    content = f"Operators need a console {uuid.uuid4()}"
    scrap = Scrap(
        user_id=user_id, content=content, content_hash=hashlib.sha256(content.encode()).hexdigest()
    )
    async with sessions() as session, session.begin():
        session.add(scrap)
    return scrap.id


async def dead_letter(
    amqp_url: str, topology: Topology, job_type: JobType, job_id: uuid.UUID
) -> None:
    """A message of a job of a type no worker runs here, rejected so RabbitMQ dead-letters
    it (a job of this deployment's, so that it can be re-driven)."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topology.jobs_exchange)
        body = {
            "message_id": str(uuid.uuid4()),
            "job_id": str(job_id),
            "job_type": job_type.value,
            "target_id": str(uuid.uuid4()),
            "user_id": str(uuid.uuid4()),
            "attempt": 1,
            "created_at": datetime.now(UTC).isoformat(),
        }
        message = aio_pika.Message(json.dumps(body).encode(), message_id=body["message_id"])
        await exchange.publish(message, routing_key=job_type.value)
        queue = await channel.get_queue(topology.queue_name(job_type))
        got = await queue.get(no_ack=False, timeout=10)
        assert got is not None
        await got.reject(requeue=False)


async def test_operator_retries_a_failed_job_and_redrives_a_dead_letter(
    fresh_db_url: str, amqp_url: str, topology: Topology, fake_ai: FakeAiServer, browser: WebDriver
) -> None:
    engine = create_engine(fresh_db_url, pool_size=10)
    sessions: Sessions = create_session_factory(engine)
    provider = build_provider(
        "openai", base_url=fake_ai.base_url, api_key="sk-test-key-123456", timeout_seconds=2
    )
    settings = api_settings(fresh_db_url, amqp_url, amqp_prefix=topology.prefix)
    try:
        async with (
            worker_and_relay(sessions, fresh_db_url, amqp_url, topology, build_handlers(provider)),
            over_http(create_app(settings)) as base,
        ):
            user_id, owner = await new_user(sessions)
            scrap_id = await a_scrap(sessions, user_id)
            fake_ai.set_fault("http_400")  # a permanent failure: the job ends FAILED
            job = await register_job(
                sessions, job_type=JobType.SCRAP_REFINE, target_id=scrap_id, user_id=user_id
            )
            failed = await settled_job(sessions, job.job_id, within=WAIT)
            assert failed.status == "FAILED", failed.error_message
            fake_ai.set_fault(None)  # the AI is healthy again
            [commit_job] = await insert_jobs(
                sessions, user_id, status="PENDING", job_type=JobType.TIL_GITHUB_COMMIT
            )
            await dead_letter(amqp_url, topology, JobType.TIL_GITHUB_COMMIT, commit_job)
            try:
                await drive_the_console(Page(browser, base), job.job_id, topology)
            finally:
                await asyncio.to_thread(browser.get, "about:blank")  # close its SSE streams
            await same_job_new_try(base, job.job_id, owner)
    finally:
        fake_ai.set_fault(None)
        await provider.aclose()
        await engine.dispose()


async def drive_the_console(page: Page, job_id: uuid.UUID, topology: Topology) -> None:
    token = operator_headers("browser-operator")["Authorization"].removeprefix("Bearer ")
    await page.open("/admin")  # no cookie yet: the login form
    await page.until("the login form", lambda d: d.find_elements(By.ID, "token"))
    await page.shot("01-login")
    await page.call(page.driver.find_element(By.ID, "token").send_keys, token)
    await page.click("#sign-in")
    await page.until("the overview", text_is("h1", "Overview"))
    await page.shot("02-overview")

    await page.open("/admin/jobs?status=FAILED")
    row = f'tr[data-job="{job_id}"]'
    await page.until("the failed job in the table", lambda d: d.find_elements(By.CSS_SELECTOR, row))
    await page.shot("03-jobs-failed")
    await page.click(f"{row} a")
    await page.until("the job page", text_is("#job-status", "FAILED"))
    await page.shot("04-job-failed")

    await page.mark()
    await page.click("#retry")
    await page.until("the job to complete", text_is("#job-status", "COMPLETED"))
    assert await page.not_reloaded(), "the page was reloaded"
    await page.shot("05-job-completed")

    dead = topology.dead_letter_queue
    github_queue = topology.queue_name(JobType.TIL_GITHUB_COMMIT)
    await page.open("/admin")
    await page.until("one dead letter", text_is(f'tr[data-queue="{dead}"] .messages', "1"))
    await page.mark()
    await page.open("/admin/dead-letters")
    await page.until("the dead letter listed", text_is("#dlq-total", "1"))
    await page.shot("06-dead-letters")
    await page.mark()
    await page.click("tr[data-message] button.redrive")
    await page.until("the dead-letter queue to empty", text_is("#dlq-total", "0"))
    assert await page.not_reloaded(), "the page was reloaded"
    await page.open("/admin")
    await page.until(
        "the message back on its queue", text_is(f'tr[data-queue="{github_queue}"] .messages', "1")
    )
    await page.until("no dead letters", text_is(f'tr[data-queue="{dead}"] .messages', "0"))
    await page.shot("07-overview-after-redrive")

    await page.open("/admin/sweeps")
    await page.click("#run-sweep")
    await page.until(
        "the request listed", lambda d: "waiting" in d.find_element(By.ID, "sweep-requests").text
    )
    await page.shot("08-sweeps")
    await page.open("/admin/audit")
    await page.until("the audit log", lambda d: "job.retry" in d.find_element(By.ID, "audit").text)
    await page.shot("09-audit")
    logs = await page.call(page.driver.get_log, "browser")
    refused = [e["message"] for e in logs if "Content Security Policy" in e["message"]]
    assert not refused, refused  # the console runs under the API's strict page CSP
    for name in (
        "01-login",
        "02-overview",
        "04-job-failed",
        "05-job-completed",
        "06-dead-letters",
        "09-audit",
    ):
        assert (SCREENSHOTS / f"{name}.png").stat().st_size > 1000


# -- acceptance: the fleet at a glance ---------------------------------------------------------

# One AI call of a stuck job, for the AI usage page.
SPENT = AiCall("m", "chat", 300, 20, 0, False, 5, Decimal("0.0042"))

# A zone far from UTC, so that a time left in UTC cannot pass for local.
ZONE = "Asia/Tokyo"


@pytest.fixture
def browser_in_zone() -> AsyncIterator[WebDriver]:
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1900", "--lang=en-US"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER, env={**os.environ, "TZ": ZONE})
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver  # type: ignore[misc]
    finally:
        driver.quit()


class Quick(JobHandler[None, str]):
    job_type: ClassVar[str] = JobType.CARD_ANALYSIS

    async def run(self, job: AsyncJob, payload: None) -> str:
        await asyncio.sleep(0.2)
        return "done"

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        return None


class Held(JobHandler[None, str]):
    """Runs until `gate` opens: its jobs stay in flight on the worker."""

    job_type: ClassVar[str] = JobType.SCRAP_REFINE

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate

    async def run(self, job: AsyncJob, payload: None) -> str:
        await self.gate.wait()
        return "done"

    async def store(self, session: AsyncSession, job: AsyncJob, result: str) -> None:
        return None


def count_at_least(css: str, attribute: str, least: int) -> Callable[[WebDriver], bool]:
    def check(driver: WebDriver) -> bool:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return bool(found) and int(found[0].get_attribute(attribute) or 0) >= least

    return check


async def test_operator_sees_the_fleet_at_a_glance(
    fresh_db_url: str, amqp_url: str, topology: Topology, browser_in_zone: WebDriver
) -> None:
    engine = create_engine(fresh_db_url, pool_size=10)
    sessions: Sessions = create_session_factory(engine)
    settings = api_settings(fresh_db_url, amqp_url, amqp_prefix=topology.prefix)
    gate = asyncio.Event()
    handlers = {JobType.CARD_ANALYSIS: Quick(), JobType.SCRAP_REFINE: Held(gate)}
    try:
        async with (
            worker_and_relay(sessions, fresh_db_url, amqp_url, topology, handlers) as runtime,
            over_http(create_app(settings)) as base,
        ):
            try:
                done = await seed(sessions, 6, [JobType.CARD_ANALYSIS], label="glance")
                await seed(sessions, 2, [JobType.SCRAP_REFINE], label="glance")
                for job_id in done.job_ids:
                    assert (await settled_job(sessions, job_id, within=WAIT)).status == "COMPLETED"
                user_id, _ = await new_user(sessions)
                # Two jobs of a type no worker here runs, due for twelve minutes: stuck.
                stuck = await insert_jobs(
                    sessions, user_id, 2, status="PENDING", job_type="TIL_GITHUB_COMMIT",
                    created_at=datetime.now(UTC) - timedelta(minutes=12),
                )  # fmt: skip
                async with sessions() as session, session.begin():
                    await ledger.insert(session, [TryUsage(
                        stuck[0], 1, user_id, "TIL_GITHUB_COMMIT", [SPENT])])  # fmt: skip
                page = Page(browser_in_zone, base)
                try:
                    await look_at_the_fleet(page, runtime.worker_id, topology, stuck[0])
                finally:
                    await asyncio.to_thread(browser_in_zone.get, "about:blank")
            finally:
                gate.set()
    finally:
        await engine.dispose()


async def read(page: Page, css: str) -> str:
    """An element's text in one call: htmx may swap the live part between two calls."""
    text = await page.call(page.driver.execute_script, """
        const found = document.querySelector(arguments[0]);
        return found ? found.innerText.trim() : null;
    """, css)  # fmt: skip
    assert text is not None, f"nothing matches {css}"
    return str(text)


async def look_at_the_fleet(
    page: Page, worker_id: str, topology: Topology, stuck: uuid.UUID
) -> None:
    token = operator_headers("fleet-operator")["Authorization"].removeprefix("Bearer ")
    await page.open("/admin")
    await page.until("the login form", lambda d: d.find_elements(By.ID, "token"))
    await page.call(page.driver.find_element(By.ID, "token").send_keys, token)
    await page.click("#sign-in")
    await page.until("the overview", text_is("h1", "Overview"))

    worker = f'tr[data-worker="{worker_id}"]'
    await page.until("the worker holding its two jobs", text_is(f"{worker} .in-flight", "2"))
    assert await read(page, f"{worker} .state") == "alive"
    assert "CARD_ANALYSIS, SCRAP_REFINE" in await read(page, worker)
    card = 'tr[data-job-type="CARD_ANALYSIS"]'
    await page.until("the percentiles", lambda d: d.find_elements(By.CSS_SELECTOR, card))
    for cell in ("wait-p50", "wait-p95", "run-p50", "run-p95"):
        shown = await read(page, f"{card} .{cell}")
        assert shown.endswith((" ms", " s")), (cell, shown)
    assert float((await read(page, f"{card} .run-p50")).split()[0]) >= 200  # Quick sleeps 0.2 s
    github = f'tr[data-pending-queue="{topology.queue_name(JobType.TIL_GITHUB_COMMIT)}"]'
    oldest = await read(page, f"{github} .oldest")
    assert oldest.endswith(" min") and 12 <= float(oldest.split()[0]) < 14, oldest
    await page.until("the minute chart", count_at_least("#minute-chart", "data-total", 6))
    bars = await page.call(page.driver.execute_script, """
        return document.querySelectorAll("#minute-chart g.minute").length;
    """)  # fmt: skip
    assert bars == 60

    # times are the browser's own zone, not UTC
    stamp = await page.call(page.driver.execute_script, """
        const t = document.querySelector(arguments[0]);
        return t && [t.getAttribute("datetime"), t.getAttribute("data-local"), t.innerText];
    """, f"{worker} time")  # fmt: skip
    utc = datetime.fromisoformat(stamp[0])
    local = utc.astimezone(ZoneInfo(ZONE))
    assert stamp[1] == ZONE
    assert local.strftime("%H:%M:%S") in stamp[2] and utc.strftime("%H:%M:%S") not in stamp[2]
    await page.shot("10-fleet-at-a-glance")

    # htmx swaps the live part of the page (the chart with it): the chart is drawn again
    await page.mark()
    await page.call(page.driver.execute_script, """
        window.__swapped = false;
        document.addEventListener("htmx:afterSettle", () => { window.__swapped = true; });
        htmx.trigger(document.body, "san:refresh");
    """)  # fmt: skip
    await page.until("a swap", lambda d: d.execute_script("return window.__swapped"))
    redrawn = await page.call(page.driver.execute_script, """
        return document.querySelectorAll("#minute-chart g.minute").length;
    """)  # fmt: skip
    assert redrawn == 60 and await page.not_reloaded()

    prefix = str(stuck)[:8]
    await page.call(page.driver.find_element(By.ID, "job-search").send_keys, prefix + "\n")
    await page.until("the job found", lambda d: d.find_elements(
        By.CSS_SELECTOR, f'tr[data-job="{stuck}"]'))  # fmt: skip
    rows = await page.call(page.driver.find_elements, By.CSS_SELECTOR, "tr[data-job]")
    assert all((r.get_attribute("data-job") or "").startswith(prefix) for r in rows), (
        "a job whose id does not start with the prefix"
    )
    await page.shot("11-job-search")

    await page.open("/admin/usage")
    await page.until("the AI usage page", text_is("h1", "AI usage"))
    row = await read(page, "#usage-per-job-type tr:nth-child(2)")
    assert row.split() == ["TIL_GITHUB_COMMIT", str(SPENT.tokens), "0.0042", "1"], row
    await page.shot("12-ai-usage")

    await page.open("/admin/scheduling")
    await page.until("the scheduling page", text_is("h1", "Scheduling"))
    shares = await read(page, "#user-shares")
    # the two held SCRAP_REFINE jobs run; the two stuck commits wait
    assert "SCRAP_REFINE" in shares and "TIL_GITHUB_COMMIT" in shares, shares
    assert "100%" in shares, shares
    assert "No upstream call yet." in await read(page, "#upstream-budgets")
    await page.shot("13-scheduling")
    logs = await page.call(page.driver.get_log, "browser")
    # (the browser's own request for /favicon.ico is no page's doing)
    problems = [
        e["message"] for e in logs if e["level"] == "SEVERE" and "favicon" not in e["message"]
    ]
    assert not problems, problems
    for name in ("10-fleet-at-a-glance", "11-job-search", "12-ai-usage", "13-scheduling"):
        assert (SCREENSHOTS / f"{name}.png").stat().st_size > 1000
