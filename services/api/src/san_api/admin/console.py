"""The operator console at /admin: server-rendered pages (Jinja2), htmx for actions and
partial reloads, one SSE stream (`/admin/events`) that tells open pages to refresh.
Assets are vendored under static/ and served by the API: no CDN, no build step."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from pydantic import ValidationError

from san_api.admin import budgets as budget_api
from san_api.admin import endpoints as api
from san_api.admin import notices, service
from san_api.admin import scheduling as scheduling_api
from san_api.admin.auth import COOKIE, Operator, get_operator, operator_from_token
from san_api.admin.schemas import BulkIn, DeadLetterAction, JobFilterIn, JobListQuery, SweepRunIn
from san_api.deps import SessionDep, SettingsDep
from san_api.errors import AppError, Unauthorized
from san_api.job_events.hub import ALL_JOBS, JobEventHub
from san_common.jobs.types import JobStatus, JobType
from san_common.models.operations import SWEEP_NAMES

_HERE = Path(__file__).parent
templates = Jinja2Templates(directory=_HERE / "templates")


def _when(moment: datetime | None, empty: str = "–") -> Markup:
    """A time as `<time>` in UTC; console.js shows it in the browser's own zone."""
    if moment is None:
        return Markup(escape(empty))
    utc = moment.astimezone(UTC)
    return Markup('<time datetime="{}">{}</time>').format(
        utc.isoformat(), utc.strftime("%Y-%m-%d %H:%M:%S UTC")
    )


def _duration(seconds: float | None) -> str:
    """Seconds as an operator reads them: 850 ms, 4.2 s, 3.5 min, 2.0 h."""
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


templates.env.filters["when"] = _when
templates.env.filters["duration"] = _duration

_STATUSES = [s.value for s in JobStatus]
_TYPES = [t.value for t in JobType]
# Broker-side numbers (queue depths) change without a database event: refresh this often.
_TICK_SECONDS = 5.0
_MIN_GAP_SECONDS = 0.5
_COOKIE_MAX_AGE = 12 * 3600


class LoginRequired(Exception):
    """No operator credentials on a console page: send the browser to the login form."""


async def _operator_or_login(request: Request, settings: SettingsDep) -> Operator:
    try:
        return await get_operator(request, settings, None)
    except Unauthorized as exc:
        raise LoginRequired from exc


async def _guard(request: Request, settings: SettingsDep) -> Operator:
    """Bearer header first (as the API), then the cookie; no credentials → login form."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return await operator_from_token(request, header[7:].strip(), "token")
    return await _operator_or_login(request, settings)


ConsoleOperator = Annotated[Operator, Depends(_guard)]

router = APIRouter(prefix="/admin", include_in_schema=False, dependencies=[Depends(_guard)])
login_router = APIRouter(prefix="/admin", include_in_schema=False)


def _page(
    request: Request, name: str, operator: Operator, nav: str, **context: Any
) -> HTMLResponse:
    notice = notices.message(request.query_params)
    return templates.TemplateResponse(
        request,
        name,
        {
            "operator": operator,
            "nav": nav,
            "title": nav,
            "notice": notice,
            "error": request.query_params.get("error") == "1",
            "statuses": _STATUSES,
            "job_types": _TYPES,
            **context,
        },
    )


def _back(
    url: str, notice: notices.NoticeKey, *, error: bool = False, **params: object
) -> RedirectResponse:
    """Back to `url`, which shows `notice` (a key of `notices.MESSAGES`) with `params`."""
    sep = "&" if "?" in url else "?"
    query = notices.query(notice, error=error, **params)
    return RedirectResponse(f"{url}{sep}{query}", status_code=303)


def _refused(url: str, exc: AppError) -> RedirectResponse:
    return _back(url, "refused", error=True, code=exc.code)


async def _form(request: Request) -> dict[str, list[str]]:
    body = (await request.body()).decode(errors="replace")
    return parse_qs(body, keep_blank_values=False)


# -- login -------------------------------------------------------------------------------------


@login_router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "login.html", {"error": None})


@login_router.post("/login")
async def login(request: Request, settings: SettingsDep) -> Response:
    token = ((await _form(request)).get("token") or [""])[0].strip()
    header = request.headers.get("authorization", "")
    if not token and header.lower().startswith("bearer "):
        token = header[7:].strip()  # a script (or a proxy) signing in without the form
    token = token or request.cookies.get(COOKIE, "")
    if not token:
        raise Unauthorized("Paste an operator token")
    await operator_from_token(request, token, "cookie")  # 401 / 403 as the API
    response = RedirectResponse("/admin", status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        max_age=_COOKIE_MAX_AGE,
        httponly=True,
        samesite="strict",
        # Secure unless in local development: behind a TLS-terminating proxy the request's
        # scheme is https only if the proxy is trusted (API_FORWARDED_ALLOW_IPS)
        secure=settings.san_env != "development" or request.url.scheme == "https",
        path="/admin",
    )
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/admin/login", status_code=303)
    response.delete_cookie(COOKIE, path="/admin")
    return response


# -- pages -------------------------------------------------------------------------------------


def _chart(cells: list[Any], hours: int) -> dict[str, Any]:
    now_hour = int(time.time() // 3600)
    slots = {now_hour - i: {"ok": 0, "bad": 0} for i in range(hours)}
    for cell in cells:
        slot = int(cell.at.timestamp() // 3600)
        if slot in slots:
            if cell.status == "COMPLETED":
                slots[slot]["ok"] += cell.count
            elif cell.status == "FAILED":
                slots[slot]["bad"] += cell.count
    peak = max([v["ok"] + v["bad"] for v in slots.values()] + [1])
    bar_w = 18
    bars = []
    for i, slot in enumerate(sorted(slots)):
        ok, bad = slots[slot]["ok"], slots[slot]["bad"]
        bars.append(
            {
                "x": i * (bar_w + 4),
                "ok": ok,
                "bad": bad,
                "ok_h": round(120 * ok / peak, 1),
                "bad_h": round(120 * bad / peak, 1),
                "label": time.strftime("%H:00", time.gmtime(slot * 3600)),
            }
        )
    return {"bars": bars, "bar_w": bar_w, "width": hours * (bar_w + 4), "peak": peak}


@router.get("", response_class=HTMLResponse)
async def overview(
    request: Request, session: SessionDep, operator: ConsoleOperator
) -> HTMLResponse:
    hours = 24
    stats = await api.stats(session, hours=hours, bucket="hour")
    outbox = await api.outbox(session)
    broker = request.app.state.broker_admin
    queues: list[Any] = []
    source = error = None
    dead = None
    try:
        view = await api.queues(session, broker)
        queues, source = view.queues, view.source
        dead = next((q.messages for q in queues if q.name == broker.topology.dead_letter_queue), 0)
    except AppError as exc:
        error = exc.detail
    count = {"COMPLETED": 0, "FAILED": 0}
    for cell in stats.buckets:
        if cell.status in count:
            count[cell.status] += cell.count
    active = sum(c.count for c in stats.totals if c.status in ("PENDING", "PROCESSING"))
    superseded = await service.superseded_since(session, stats.since)
    workers = await api.workers(session)
    timings = await api.timings(session, broker, minutes=60)
    return _page(
        request,
        "overview.html",
        operator,
        "Overview",
        overview={
            "completed": count["COMPLETED"],
            "failed": count["FAILED"] - superseded,
            "superseded": superseded,
            "active": active,
            "hours": hours,
        },
        chart=_chart(stats.buckets, hours),
        outbox=outbox,
        queues=queues,
        queues_source=source,
        queues_error=error,
        dead_letters=dead,
        totals={(c.jobType, c.status): c.count for c in stats.totals},
        workers=workers,
        timings=timings,
    )


_TEXT_FILTERS = ("jobId", "user", "createdFrom", "createdTo", "finishedFrom", "finishedTo", "error")


def _filter_from_query(request: Request) -> JobFilterIn:
    params = request.query_params
    raw: dict[str, Any] = {
        "status": [s for s in params.getlist("status") if s],
        "type": [t for t in params.getlist("type") if t],
    }
    for key in _TEXT_FILTERS:
        if params.get(key):
            raw[key] = params[key].strip()
    return JobFilterIn.model_validate(raw)


@router.get("/jobs", response_class=HTMLResponse)
async def jobs_page(
    request: Request, session: SessionDep, settings: SettingsDep, operator: ConsoleOperator
) -> Response:
    try:
        form = _filter_from_query(request)
    except ValidationError:
        return _back("/admin/jobs", "invalid", error=True)
    cursor = request.query_params.get("cursor") or None
    query = JobListQuery.model_validate({**form.model_dump(), "cursor": cursor, "limit": 50})
    try:
        page = await api.list_jobs(session, query)
    except AppError as exc:
        return _refused("/admin/jobs", exc)
    pairs = [
        (k, v)
        for k, v in request.query_params.multi_items()
        if k not in ("cursor", "notice", "error", *notices.PARAMETERS) and v
    ]
    bulk = None
    if form.jobId or form.status or form.type or form.user or form.error or form.createdFrom:
        limit = settings.admin_bulk_limit
        f = api.to_filter(form)
        bulk = {
            "retry": await service.preview(session, "retry", f, limit),
            "cancel": await service.preview(session, "cancel", f, limit),
            "limit": limit,
        }
    next_query = urlencode([*pairs, ("cursor", page.nextCursor or "")])
    return _page(
        request,
        "jobs.html",
        operator,
        "Jobs",
        page=page,
        form=form,
        bulk=bulk,
        query_pairs=pairs,
        next_query=next_query,
    )


@router.post("/jobs/bulk")
async def jobs_bulk(
    request: Request, session: SessionDep, settings: SettingsDep, operator: ConsoleOperator
) -> Response:
    form = await _form(request)
    action = (form.pop("action", [""]) or [""])[0]
    raw: dict[str, Any] = {"status": form.get("status", []), "type": form.get("type", [])}
    for key in _TEXT_FILTERS:
        if form.get(key):
            raw[key] = form[key][0].strip()
    back = "/admin/jobs?" + urlencode([(k, v) for k, vs in form.items() for v in vs])
    try:
        body = BulkIn.model_validate({"action": action, "filter": raw})
        result = await api.bulk_action(body, session, settings, operator)
    except ValidationError:
        return _back(back, "invalid", error=True)
    except AppError as exc:
        return _refused(back, exc)
    done: notices.NoticeKey = "bulk-retry" if body.action == "retry" else "bulk-cancel"
    return _back(back, done, count=result.count)


@router.get("/jobs/{jobId}", response_class=HTMLResponse)
async def job_page(
    request: Request, jobId: uuid.UUID, session: SessionDep, operator: ConsoleOperator
) -> HTMLResponse:
    detail = await api.job_detail(jobId, session)
    return _page(request, "job.html", operator, "Jobs", d=detail)


@router.post("/jobs/{jobId}/retry")
async def job_retry(jobId: uuid.UUID, session: SessionDep, operator: ConsoleOperator) -> Response:
    try:
        await api.retry_job(jobId, session, operator)
    except AppError as exc:
        return _refused(f"/admin/jobs/{jobId}", exc)
    return _back(f"/admin/jobs/{jobId}", "retried")


@router.post("/jobs/{jobId}/cancel")
async def job_cancel(jobId: uuid.UUID, session: SessionDep, operator: ConsoleOperator) -> Response:
    try:
        await api.cancel_job(jobId, session, operator)
    except AppError as exc:
        return _refused(f"/admin/jobs/{jobId}", exc)
    return _back(f"/admin/jobs/{jobId}", "cancelled")


@router.post("/job-types/{jobType}/pause")
async def job_type_pause(
    jobType: JobType, session: SessionDep, operator: ConsoleOperator
) -> Response:
    await api.pause(jobType, session, operator)
    return _back("/admin", "paused", type=jobType.value)


@router.post("/job-types/{jobType}/resume")
async def job_type_resume(
    jobType: JobType, session: SessionDep, operator: ConsoleOperator
) -> Response:
    await api.resume(jobType, session, operator)
    return _back("/admin", "resumed", type=jobType.value)


@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letters_page(
    request: Request, session: SessionDep, operator: ConsoleOperator
) -> HTMLResponse:
    view = error = None
    try:
        view = await api.dead_letters(session, request.app.state.broker_admin, limit=100)
    except AppError as exc:
        error = exc.detail
    return _page(
        request, "dead_letters.html", operator, "Dead letters", view=view, broker_error=error
    )


async def _dead_letter_post(
    action: str, request: Request, session: SessionDep, operator: Operator
) -> Response:
    params = request.query_params
    raw: dict[str, Any] = {}
    if params.get("all"):
        raw["all"] = True
    if params.get("messageId"):
        raw["messageId"] = params["messageId"]
    if params.get("jobType"):
        raw["jobType"] = params["jobType"]
    try:
        body = DeadLetterAction.model_validate(raw)
        result = await api._dead_letter_action(
            action,
            body,
            session,
            request.app.state.sessions,
            request.app.state.broker_admin,
            operator.name,
        )
    except ValidationError:
        return _back("/admin/dead-letters", "invalid", error=True)
    except AppError as exc:
        return _refused("/admin/dead-letters", exc)
    if action == "purge":
        return _back("/admin/dead-letters", "purged", count=result.count)
    # the reasons of those left are in the list, which still shows them
    left = any(i.result in ("not-redrivable", "failed") for i in result.items)
    return _back(
        "/admin/dead-letters",
        "redriven",
        error=left or not result.items,
        count=result.count,
        unredrivable=result.notRedrivable,
        failed=result.failed,
    )


@router.post("/dead-letters/redrive")
async def dead_letters_redrive(
    request: Request, session: SessionDep, operator: ConsoleOperator
) -> Response:
    return await _dead_letter_post("redrive", request, session, operator)


@router.post("/dead-letters/purge")
async def dead_letters_purge(
    request: Request, session: SessionDep, operator: ConsoleOperator
) -> Response:
    return await _dead_letter_post("purge", request, session, operator)


@router.get("/sweeps", response_class=HTMLResponse)
async def sweeps_page(
    request: Request, session: SessionDep, operator: ConsoleOperator
) -> HTMLResponse:
    view = await api.sweeps(session, limit=50)
    return _page(request, "sweeps.html", operator, "Sweeps", view=view, sweep_names=SWEEP_NAMES)


@router.post("/sweeps/run")
async def sweeps_run(request: Request, session: SessionDep, operator: ConsoleOperator) -> Response:
    names = (await _form(request)).get("sweep", [])
    try:
        body = SweepRunIn.model_validate({"sweeps": names})
        await api.run_sweeps(body, session, operator)
    except ValidationError:
        return _back("/admin/sweeps", "invalid", error=True)
    except AppError as exc:
        return _refused("/admin/sweeps", exc)
    return _back("/admin/sweeps", "sweeps-requested", sweeps=",".join(body.sweeps))


@router.get("/usage", response_class=HTMLResponse)
async def usage_page(
    request: Request, session: SessionDep, operator: ConsoleOperator
) -> HTMLResponse:
    view = await budget_api.usage(session, days=30)
    return _page(request, "usage.html", operator, "AI usage", view=view)


@router.get("/scheduling", response_class=HTMLResponse)
async def scheduling_page(
    request: Request, session: SessionDep, operator: ConsoleOperator
) -> HTMLResponse:
    view = await scheduling_api.scheduling(session, limit=200)
    return _page(request, "scheduling.html", operator, "Scheduling", view=view)


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(
    request: Request, session: SessionDep, operator: ConsoleOperator
) -> HTMLResponse:
    raw = request.query_params.get("cursor")
    cursor = int(raw) if raw and raw.isdigit() and 0 < int(raw) < 2**63 else None
    page = await api.audit_log(session, cursor=cursor, limit=100)
    return _page(request, "audit.html", operator, "Audit log", page=page)


@router.get("/events")
async def console_events(request: Request, settings: SettingsDep) -> StreamingResponse:
    """Tells open console pages to refresh: at once (throttled) when any job changes,
    and every few seconds for the broker-side numbers."""
    hub: JobEventHub = request.app.state.job_events

    async def stream() -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        async with hub.subscribe(ALL_JOBS) as subscription:
            while not await request.is_disconnected():
                try:
                    await asyncio.wait_for(subscription.wake.wait(), timeout=_TICK_SECONDS)
                    reason = "jobs"
                except TimeoutError:
                    reason = "tick"
                subscription.wake.clear()
                yield f"data: {reason}\n\n"
                await asyncio.sleep(_MIN_GAP_SECONDS)

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def install(app: FastAPI) -> None:
    @app.exception_handler(LoginRequired)
    async def _to_login(_request: Request, _exc: LoginRequired) -> Response:
        return RedirectResponse("/admin/login", status_code=303)

    app.include_router(login_router)
    app.include_router(router)
    app.mount("/admin/static", StaticFiles(directory=_HERE / "static"), name="admin-static")
