"""The contracts `san_common.compat` relies on, one test per kept use of a library's
internals: an upgrade of SQLAlchemy or uvicorn/httptools that breaks one fails here.
(The behaviour the API builds on the protocol is tested end to end in tests/api/test_edge.py.)"""

from __future__ import annotations

import asyncio
import inspect
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import httptools
import pytest
import sqlalchemy
import uvicorn
from sqlalchemy import inspect as sa_inspect
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from san_common.compat import OVER_CAPACITY, head_limited_httptools, new_orm_instance
from san_common.models import AsyncJob


def _job_values() -> dict[str, Any]:
    values: dict[str, Any] = {c.key: None for c in AsyncJob.__table__.columns}
    values.update(
        job_id=uuid.uuid4(),
        job_type="scrap_refine",
        status="PROCESSING",
        tries=3,
        checkpoint={"step": 2},
        created_at=datetime.now(UTC),
    )
    return values


def test_a_new_orm_instance_holds_its_values_as_loaded_not_as_changes() -> None:
    values = _job_values()
    job = new_orm_instance(AsyncJob, values)
    assert type(job) is AsyncJob
    assert {key: getattr(job, key) for key in values} == values
    state = sa_inspect(job)
    # what "built the way the ORM builds the rows it loads" means: instrumented, in no
    # session, and its values are not pending changes (so no flush would write them)
    assert state.transient
    assert not state.modified
    assert all(not state.attrs[key].history.has_changes() for key in values)
    # the constructor's path, for contrast: the same values are changes there
    assert sa_inspect(AsyncJob(job_id=values["job_id"])).modified


def test_a_new_orm_instance_is_readable_in_a_process_whose_mappers_are_unconfigured() -> None:
    # A fresh worker may claim before anything else touched the ORM: the first call must
    # configure the mappers itself (a new process, as `configure_mappers` is once per process).
    code = (
        "import uuid\n"
        "from sqlalchemy import inspect\n"
        "from san_common.compat import new_orm_instance\n"
        "from san_common.models import AsyncJob\n"
        "assert not inspect(AsyncJob).configured, 'configured at import: nothing to test'\n"
        "job_id = uuid.uuid4()\n"
        "job = new_orm_instance(AsyncJob, {'job_id': job_id, 'tries': 1})\n"
        "assert job.job_id == job_id and job.tries == 1\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_sqlalchemy_is_the_series_the_contract_was_checked_on() -> None:
    # `manager_of_class(...).new_instance` and instance `__dict__` semantics are internal:
    # a new minor series needs this file read again (and libs/common/pyproject.toml's pin).
    assert sqlalchemy.__version__.startswith("2.1."), sqlalchemy.__version__


# --- uvicorn's httptools protocol ------------------------------------------------------

_HOOKS = {
    "connection_made": ["transport"],
    "connection_lost": ["exc"],
    "data_received": ["data"],
    "on_message_begin": [],
    "on_url": ["url"],
    "on_header": ["name", "value"],
    "on_headers_complete": [],
    "on_message_complete": [],
    "send_400_response": ["msg"],
}


@pytest.mark.parametrize("hook", sorted(_HOOKS))
def test_the_protocol_hooks_the_edge_overrides_keep_their_signatures(hook: str) -> None:
    method = getattr(HttpToolsProtocol, hook)
    parameters = list(inspect.signature(method).parameters)
    assert parameters == ["self", *_HOOKS[hook]]


def test_an_exception_in_a_parser_callback_is_a_parser_error_which_uvicorn_answers_400() -> None:
    # `_count_head` raises from `on_url`/`on_header`; httptools wraps it, and uvicorn's
    # `data_received` answers any `HttpParserError` with a 400.
    assert issubclass(httptools.HttpParserCallbackError, httptools.HttpParserError)
    source = inspect.getsource(HttpToolsProtocol.data_received)
    assert "HttpParserError" in source and "send_400_response" in source


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _capacity(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b"over" if scope.get(OVER_CAPACITY) else b"ok"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def _served(
    header_timeout: float, max_header_bytes: int, app: Any = _ok, **caps: Any
) -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        http=head_limited_httptools(header_timeout, max_header_bytes, **caps),
        lifespan="off",
        log_level="critical",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task
        sock.close()


async def _exchange(port: int, request: bytes, *, wait: float = 5) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(wait):
            return await reader.read()  # until the server closes
    finally:
        writer.close()


async def test_the_subclassed_protocol_serves_refuses_a_large_head_and_times_a_slow_one() -> None:
    async with _served(header_timeout=0.5, max_header_bytes=1024) as port:
        answer = await _exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200") and b"\r\nok\r\n" in answer

        large = b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 2048 + b"\r\n\r\n"
        assert (await _exchange(port, large)).startswith(b"HTTP/1.1 400")

        started = asyncio.get_running_loop().time()
        assert await _exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\n") == b""  # closed
        assert asyncio.get_running_loop().time() - started < 3


async def test_beyond_the_connection_cap_requests_are_marked_except_the_exempt_paths() -> None:
    caps = {"max_connections": 2, "exempt_paths": frozenset({"/healthz"})}
    async with _served(5, 4096, _capacity, **caps) as port:
        request = b"GET %s HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        assert (await _exchange(port, request % b"/")).endswith(b"ok\r\n0\r\n\r\n")
        _, idle = await asyncio.open_connection("127.0.0.1", port)  # one open: two with ours
        try:
            await asyncio.sleep(0.1)
            assert b"over" in await _exchange(port, request % b"/me?x=1")
            assert b"over" not in await _exchange(port, request % b"/healthz")
        finally:
            idle.close()
