"""The HTTP edge over real sockets: a lost database answers 503 and the same keep-alive
connection works once it is back; a 500 keeps the connection; security headers on every
answer and no server banner; oversized and unfinished headers and slow bodies are refused
or closed within the configured limits while the API's memory stays bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from san_api import edge
from san_api.app import create_app
from san_api.auth.tokens import mint
from san_api.errors import database_unavailable
from san_api.settings import ApiSettings
from san_common.db.engine import plain_url
from san_common.db.migrate import upgrade
from tests import infra
from tests.api.support import PROBLEM_JSON, over_http
from tests.conftest import JWT_SECRET, TOKEN_KEYS, api_settings
from tests.faults.postgres import DedicatedPostgres, dedicated_postgres
from tests.procs import ServiceProcess, start, wait_healthy
from tests.tcp_proxy import TcpProxy
from tests.waiting import eventually


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One HTTP/1.1 keep-alive connection, driven by hand (so the test knows it is one)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, base_url: str) -> Connection:
        host, port = base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> Answer:
        lines = [f"{method} {path} HTTP/1.1", "Host: api"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body:
            lines.append(f"Content-Length: {len(body)}")
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await self.writer.drain()
        return await asyncio.wait_for(self.answer(), 60)

    async def answer(self) -> Answer:
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return Answer(int(status_line.split()[1]), headers, body)

    async def closed_by_server(self) -> bool:
        """True once the server has closed its end (EOF or a reset)."""
        try:
            return await asyncio.wait_for(self.reader.read(65536), 0.2) == b""
        except TimeoutError:
            return False
        except ConnectionError:
            return True

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


def _bearer(subject: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"}


def _numbered_scraps() -> Callable[[], bytes]:
    """A `POST /scraps` body of new content at each call (no dedup shortcut)."""
    counter = iter(range(1_000_000))
    return lambda: json.dumps({"content": f"scrap {next(counter)}"}).encode()


@contextlib.asynccontextmanager
async def served(settings: ApiSettings, **routes: Callable[[], Any]) -> AsyncIterator[str]:
    app = create_app(settings)
    for path, endpoint in routes.items():
        app.add_api_route(f"/{path}", endpoint, include_in_schema=False)
    async with over_http(app, **edge.server_options(settings)) as url:
        yield url


# -- the database goes away ------------------------------------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[DedicatedPostgres]:
    """A server of this test's own: stopping it touches nobody else's tests."""
    with dedicated_postgres(max_connections=50) as server:
        yield server


async def test_database_down_is_503_and_the_same_connection_works_when_it_is_back(
    own_postgres: DedicatedPostgres, amqp_url: str
) -> None:
    name = infra.unique_name("san_outage")
    admin = await asyncpg.connect(plain_url(own_postgres.url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    db_url = infra.with_database(own_postgres.url, name)
    await asyncio.to_thread(upgrade, db_url)
    user = _bearer("outage-" + uuid.uuid4().hex)

    async with served(api_settings(db_url, amqp_url)) as url:
        connection = await Connection.open(url)
        try:
            assert (await connection.request("GET", "/me", user)).status == 200
            await asyncio.to_thread(own_postgres.stop_fast)
            for method, path, body in (
                ("GET", "/me", b""),
                ("POST", "/scraps", b'{"content": "while the database is down"}'),
            ):
                headers = {**user, "Content-Type": "application/json"}
                down = await connection.request(method, path, headers, body)
                assert down.status == 503, down.body
                assert down.headers["content-type"] == PROBLEM_JSON
                assert int(down.headers["retry-after"]) >= 1
                assert down.json()["code"] == "DATABASE_UNAVAILABLE"
                assert "asyncpg" not in down.body.decode() and name not in down.body.decode()
            await asyncio.to_thread(own_postgres.start)
            back = await connection.request("GET", "/me", user)
            assert back.status == 200, back.body
        finally:
            await connection.aclose()


@pytest.mark.parametrize("limits", [False, True], ids=["limits-off", "limits-on"])
async def test_terminated_database_connections_cost_one_503_not_one_per_pooled_connection(
    db_url: str, amqp_url: str, limits: bool
) -> None:
    """`POST /scraps` runs on the API's asyncpg pool, outside SQLAlchemy's disconnect
    handling: when the server drops every connection, one request may meet a dead one
    (503, never 500) and the pool must then replace the others, as SQLAlchemy would,
    rather than let each fail a request of its own. The backends die a moment after
    `pg_terminate_backend` returns, so whether a second request would meet a dead one is
    a race: five rounds make it one the test sees. With the limits off nothing but the
    request's transaction touches a pool."""
    headers = {**_bearer("terminated-" + uuid.uuid4().hex), "Content-Type": "application/json"}
    scrap = _numbered_scraps()

    async with served(api_settings(db_url, amqp_url, rate_limit_enabled=limits)) as url:
        connections = [await Connection.open(url) for _ in range(8)]
        admin = await asyncpg.connect(plain_url(db_url))
        try:
            for _ in range(5):
                warm = await asyncio.gather(
                    *(c.request("POST", "/scraps", headers, scrap()) for c in connections)
                )
                assert [a.status for a in warm] == [202] * 8
                killed = await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                assert killed >= 3  # the pool held several connections: the case under test

                answers = [
                    await connections[0].request("POST", "/scraps", headers, scrap())
                    for _ in range(12)
                ]
                lost = [a for a in answers if a.status != 202]
                assert len(lost) <= 1, [(a.status, a.body) for a in answers]
                for answer in lost:
                    assert answer.status == 503, answer.body
                    assert answer.json()["code"] == "DATABASE_UNAVAILABLE"
            assert (await connections[0].request("GET", "/me", headers)).status == 200
        finally:
            await admin.close()
            for connection in connections:
                await connection.aclose()


@pytest.mark.parametrize("limits", [False, True], ids=["limits-off", "limits-on"])
async def test_a_request_that_finds_every_pooled_connection_busy_answers_503_in_time(
    db_url: str, amqp_url: str, limits: bool
) -> None:
    """Every connection of the asyncpg pool held elsewhere (a slow query each, say): the
    request waits `API_DATABASE_TIMEOUT_SECONDS` for one and answers 503, not 500 and not
    never; once one comes free it is served again."""
    timeout = 0.5
    settings = api_settings(
        db_url, amqp_url, rate_limit_enabled=limits, api_database_timeout_seconds=timeout
    )
    app = create_app(settings)
    headers = _bearer("busy-" + uuid.uuid4().hex)
    async with over_http(app) as url, httpx.AsyncClient(base_url=url) as client:
        pool: asyncpg.Pool = app.state.connections
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            busy = await client.post("/scraps", json={"content": "busy"}, headers=headers)
            took = loop.time() - started
            assert busy.status_code == 503, busy.text
            assert busy.json()["code"] == "DATABASE_UNAVAILABLE"
            assert "did not answer in time" in busy.json()["detail"]
            assert timeout <= took < timeout + 2, took
        finally:
            for connection in held:
                await pool.release(connection)
        served = await client.post("/scraps", json={"content": "free"}, headers=headers)
        assert served.status_code == 202, served.text


PARTITION_TIMEOUT = 1.5  # API_DATABASE_TIMEOUT_SECONDS in the partition test
LISTED = "/github-star-recommendations"  # an endpoint on SQLAlchemy's session: a SELECT


@pytest.mark.parametrize("limits", [False, True], ids=["limits-off", "limits-on"])
async def test_stranded_database_connections_cost_one_503_not_one_per_pooled_connection(
    db_url: str, amqp_url: str, limits: bool
) -> None:
    """The test above without its race: every connection the pool holds is stranded (a
    failover or a NAT that forgot them: open, silent, never reset, so the client cannot
    notice before it uses one), new ones get through. The first request meets a stranded
    one and answers 503 after the timeout; the pool must then replace all the others, so
    the next requests are served — not one 503 per stranded connection."""
    headers = {**_bearer("stranded-" + uuid.uuid4().hex), "Content-Type": "application/json"}
    scrap = _numbered_scraps()
    with TcpProxy(db_url) as proxy:
        settings = api_settings(
            proxy.url,
            amqp_url,
            rate_limit_enabled=limits,
            api_database_timeout_seconds=PARTITION_TIMEOUT,
        )
        async with served(settings) as url:
            connections = [await Connection.open(url) for _ in range(8)]
            try:
                warm = await asyncio.gather(
                    *(c.request("POST", "/scraps", headers, scrap()) for c in connections)
                )
                assert [a.status for a in warm] == [202] * 8
                await asyncio.to_thread(proxy.strand)
                async with asyncio.timeout(30):
                    answers = [
                        await connections[0].request("POST", "/scraps", headers, scrap())
                        for _ in range(6)
                    ]
                first, rest = answers[0], answers[1:]
                assert first.status == 503, first.body  # it met a stranded connection
                assert first.json()["code"] == "DATABASE_UNAVAILABLE"
                assert [a.status for a in rest] == [202] * 5, [(a.status, a.body) for a in rest]
            finally:
                for connection in connections:
                    await connection.aclose()


@pytest.mark.parametrize("limits", [False, True], ids=["limits-off", "limits-on"])
async def test_a_database_that_stops_answering_costs_503s_in_time_and_the_api_resumes(
    db_url: str, amqp_url: str, limits: bool
) -> None:
    """A network partition: the server's connections stay open and nothing comes back, no
    reset, no refusal. Requests on either pool (asyncpg's for `POST /scraps` and the rate
    limiter, SQLAlchemy's for the rest) must answer 503 within a few timeouts — not hang
    until TCP gives up, a quarter of an hour later — and once the network heals the API
    serves again by itself, on connections that are not the stuck ones."""
    headers = {**_bearer("partition-" + uuid.uuid4().hex), "Content-Type": "application/json"}
    scrap = _numbered_scraps()

    async def both_paths(connections: list[Connection]) -> list[Answer]:
        half = len(connections) // 2
        async with asyncio.timeout(20):  # a hang fails the test instead of blocking it
            return await asyncio.gather(
                *(c.request("POST", "/scraps", headers, scrap()) for c in connections[:half]),
                *(c.request("GET", LISTED, headers) for c in connections[half:]),
            )

    with TcpProxy(db_url) as proxy:
        settings = api_settings(
            proxy.url,
            amqp_url,
            rate_limit_enabled=limits,
            api_database_timeout_seconds=PARTITION_TIMEOUT,
        )
        async with served(settings) as url:
            connections = [await Connection.open(url) for _ in range(6)]
            try:
                warm = await both_paths(connections)  # each pool holds open connections
                assert [a.status for a in warm] == [202] * 3 + [200] * 3, warm

                await asyncio.to_thread(proxy.freeze)
                loop = asyncio.get_running_loop()
                started = loop.time()
                cut_off = await both_paths(connections)
                took = loop.time() - started
                for answer in cut_off:
                    assert answer.status == 503, answer.body
                    assert answer.json()["code"] == "DATABASE_UNAVAILABLE"
                    assert "did not answer in time" in answer.json()["detail"], answer.body
                    assert int(answer.headers["retry-after"]) >= 1
                # a statement's timeout, then at most a rollback's and a release's
                assert took < 3 * PARTITION_TIMEOUT + 2, took

                await asyncio.to_thread(proxy.thaw)

                seen: list[int] = []

                async def serving() -> bool:
                    seen[:] = [a.status for a in await both_paths(connections)]
                    return seen == [202] * 3 + [200] * 3

                await eventually(
                    serving,
                    within=30,
                    what="both pools serving again after the partition",
                    context=lambda: f"last statuses {seen}",
                )
            finally:
                for connection in connections:
                    await connection.aclose()


async def test_a_closed_asyncpg_connection_reads_as_a_lost_database(db_url: str) -> None:
    """asyncpg's words for a connection that died under it (SQLAlchemy's asyncpg dialect
    treats them as a disconnect too): a 503, not a 500. Another misuse of the same error
    class is no outage."""
    connection = await asyncpg.connect(plain_url(db_url))
    transaction = connection.transaction()
    await transaction.start()
    with pytest.raises(asyncpg.InterfaceError) as misuse:
        await transaction.start()
    assert database_unavailable(misuse.value) is None
    await connection.close()
    with pytest.raises(asyncpg.InterfaceError) as closed:
        connection.transaction()
    assert database_unavailable(closed.value) == "The database connection was lost; retry later"


# -- answers --------------------------------------------------------------------------------


def _boom() -> None:
    raise RuntimeError("a bug with a secret path /srv/internal/secret.txt")


async def test_a_500_keeps_the_connection_and_says_nothing_inside(
    db_url: str, amqp_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with served(api_settings(db_url, amqp_url), boom=_boom) as url:
        connection = await Connection.open(url)
        try:
            failed = await connection.request("GET", "/boom")
            assert failed.status == 500
            assert failed.headers["content-type"] == PROBLEM_JSON
            assert failed.json()["code"] == "INTERNAL_ERROR"
            assert b"secret" not in failed.body
            assert (await connection.request("GET", "/healthz")).status == 200
        finally:
            await connection.aclose()
    assert "secret.txt" in caplog.text  # the log has the cause


async def test_every_answer_has_security_headers_and_no_server_banner(
    db_url: str, amqp_url: str
) -> None:
    settings = api_settings(db_url, amqp_url, request_max_bytes=2048)
    user = _bearer("headers-" + uuid.uuid4().hex)
    async with served(settings) as url:
        connection = await Connection.open(url)
        try:
            answers = {
                "json": await connection.request("GET", "/me", user),
                "401": await connection.request("GET", "/me"),
                "404": await connection.request("GET", "/no-such-route"),
                "413": await connection.request(
                    "POST", "/scraps", {**user, "Content-Type": "application/json"}, b"x" * 4096
                ),
            }
        finally:
            await connection.aclose()
        assert [a.status for a in answers.values()] == [200, 401, 404, 413]
        for what, answer in answers.items():
            assert "server" not in answer.headers, what
            assert answer.headers["x-content-type-options"] == "nosniff", what
            assert answer.headers["referrer-policy"] == "no-referrer", what
            assert answer.headers["x-frame-options"] == "DENY", what
            assert answer.headers["cache-control"] == "no-store", what
            assert answer.headers["content-security-policy"] == edge.DATA_CSP, what
        assert answers["413"].json()["title"] == "The content is too large"


async def test_the_two_413_answers_have_one_title(db_url: str, amqp_url: str) -> None:
    """Declared too large (refused before reading) and found too large while reading."""
    settings = api_settings(db_url, amqp_url, request_max_bytes=2048)
    user = _bearer("big-" + uuid.uuid4().hex)
    async with served(settings) as url:
        connection = await Connection.open(url)
        try:
            declared = await connection.request(
                "POST", "/scraps", {**user, "Content-Type": "application/json"}, b"x" * 4096
            )
        finally:
            await connection.aclose()
        chunked = await Connection.open(url)
        try:
            lines = ["POST /scraps HTTP/1.1", "Host: api", "Transfer-Encoding: chunked"]
            lines += [f"{k}: {v}" for k, v in user.items()] + ["Content-Type: application/json"]
            chunk = b"x" * 1500
            body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
            chunked.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            streamed = await asyncio.wait_for(chunked.answer(), 60)
        finally:
            await chunked.aclose()
    assert declared.status == streamed.status == 413
    assert declared.json()["title"] == streamed.json()["title"] == "The content is too large"
    assert declared.json()["code"] == streamed.json()["code"] == "CONTENT_TOO_LARGE"


async def test_a_request_head_over_the_header_limit_is_refused_and_a_body_is_not_its_head(
    db_url: str, amqp_url: str
) -> None:
    limit = 4096
    settings = api_settings(db_url, amqp_url, http_max_header_bytes=limit, request_max_bytes=65536)
    user = _bearer("head-" + uuid.uuid4().hex)
    async with served(settings) as url:
        # just under the limit, with a body far over it in the same write: 200s on one
        # connection, twice (the count starts again for the next request)
        connection = await Connection.open(url)
        try:
            padding = {"X-Pad": "p" * (limit - 600)}
            body = json.dumps({"content": "b" * 20_000}).encode()
            for _ in range(2):
                saved = await connection.request(
                    "POST", "/scraps", {**user, **padding, "Content-Type": "application/json"}, body
                )
                assert saved.status == 202, saved.body
                assert (await connection.request("GET", "/me", {**user, **padding})).status == 200
        finally:
            await connection.aclose()

        # over it: unfinished in one write, unfinished dripped in small writes (the head
        # grows across reads), and complete with a body in one write
        complete = "\r\nContent-Length: 2\r\n\r\n{}"
        for pieces, end in ((1, ""), (64, ""), (1, complete)):
            over = await Connection.open(url)
            try:
                pad = "p" * (limit + 100)
                head = f"POST /me HTTP/1.1\r\nHost: api\r\nX-Pad: {pad}{end}".encode()
                step = -(-len(head) // pieces)
                for at in range(0, len(head), step):
                    over.writer.write(head[at : at + step])
                    await over.writer.drain()
                answer = await asyncio.wait_for(over.reader.read(), 30)
                assert answer.startswith(b"HTTP/1.1 400"), (pieces, answer[:200])
                assert await over.closed_by_server()
            finally:
                await over.aclose()


async def test_a_pipelined_request_s_body_is_not_counted_as_a_head(
    db_url: str, amqp_url: str
) -> None:
    """The second of two pipelined requests has its head parsed while the first is served;
    the rest of its body, sent after the first answer, is body, not the next head."""
    limit = 4096
    settings = api_settings(db_url, amqp_url, http_max_header_bytes=limit, request_max_bytes=65536)
    user = _bearer("pipelined-" + uuid.uuid4().hex)
    head = ["POST /scraps HTTP/1.1", "Host: api", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in user.items()]

    def request(content: str) -> bytes:
        body = json.dumps({"content": content}).encode()
        return ("\r\n".join([*head, f"Content-Length: {len(body)}", "", ""])).encode() + body

    async with served(settings) as url:
        connection = await Connection.open(url)
        try:
            second = request("s" * 20_000)
            cut = second.index(b"\r\n\r\n") + 4 + 100  # its head and a little of its body
            connection.writer.write(request("first") + second[:cut])
            await connection.writer.drain()
            first = await asyncio.wait_for(connection.answer(), 30)
            connection.writer.write(second[cut:])
            await connection.writer.drain()
            answer = await asyncio.wait_for(connection.answer(), 30)
        finally:
            await connection.aclose()
    assert (first.status, answer.status) == (202, 202), answer.body


async def test_connections_beyond_the_cap_are_refused_with_503_but_the_probes_are_answered(
    db_url: str, amqp_url: str
) -> None:
    """Idle connections fill the cap: a request beyond it is a 503 problem with
    `Retry-After` and its connection closed — except the health and readiness probes, so a
    flood of connections never makes the orchestrator restart a healthy process."""
    settings = api_settings(db_url, amqp_url, http_max_connections=3)
    async with served(settings) as url:
        idle = [await Connection.open(url) for _ in range(3)]
        extra = [await Connection.open(url) for _ in range(3)]
        try:
            refused = await extra[0].request("GET", "/me", headers=_bearer("capped"))
            assert refused.status == 503, refused
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.json()["code"] == "SERVER_BUSY"
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.headers["connection"] == "close"
            assert await extra[0].closed_by_server()
            for connection, probe in zip(extra[1:], ("/healthz", "/readyz"), strict=True):
                answer = await connection.request("GET", probe)
                assert answer.status == 200, (probe, answer)
        finally:
            for connection in [*idle, *extra]:
                await connection.aclose()
        assert (await _fresh_get(url, "/me")).status == 401  # below the cap again: served


async def _fresh_get(url: str, path: str) -> Answer:
    connection = await Connection.open(url)
    try:
        return await connection.request("GET", path)
    finally:
        await connection.aclose()


# -- hostile clients, against the real `san-api` process --------------------------------------

HEADER_TIMEOUT, BODY_TIMEOUT = 1, 2


@pytest.fixture
def api_process(db_url: str, amqp_url: str, tmp_path: Path) -> Iterator[tuple[str, int]]:
    port = infra.free_port()
    env = {
        "DATABASE_URL": db_url,
        "AMQP_URL": amqp_url,
        "AUTH_JWT_SECRET": JWT_SECRET,
        "TOKEN_ENCRYPTION_KEYS": TOKEN_KEYS,
        "API_PORT": str(port),
        "SAN_ENV": "test",
        "DATA_DIR": str(tmp_path / "data"),
        "HTTP_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
        "HTTP_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
    }
    process: ServiceProcess = start("api", env, tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, timeout=120)  # a loaded machine starts slowly
        yield url, process.popen.pid
    finally:
        process.terminate()
    assert "Traceback" not in process.log(), process.log()[-3000:]


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _send_huge_header(url: str, size: int) -> bytes:
    """Send `size` bytes of one header; what the server answered before it closed."""
    connection = await Connection.open(url)
    try:
        connection.writer.write(b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-Huge: ")
        chunk = b"a" * 65536
        with contextlib.suppress(ConnectionError):
            for _ in range(size // len(chunk)):
                connection.writer.write(chunk)
                await connection.writer.drain()
        with contextlib.suppress(ConnectionError):
            return await asyncio.wait_for(connection.reader.read(), 30)
        return b""
    finally:
        await connection.aclose()


async def test_hostile_headers_and_bodies_are_cut_off_and_memory_stays_bounded(
    api_process: tuple[str, int],
) -> None:
    url, pid = api_process
    assert (await _fresh_get(url, "/healthz")).status == 200
    before = _rss_bytes(pid)

    # four 32 MB headers at once: refused (400) once past HTTP_MAX_HEADER_BYTES, closed
    answers = await asyncio.gather(*(_send_huge_header(url, 32 * 1024 * 1024) for _ in range(4)))
    for answer in answers:
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:200]

    # headers that never end, and a connection that never sends a request
    unfinished = [await Connection.open(url) for _ in range(20)]
    for n, connection in enumerate(unfinished):
        if n % 2:
            connection.writer.write(b"GET /healthz HTTP/1.1\r\nHost: api\r\nX-Slow: ")
            await connection.writer.drain()
    # bodies that drip: a byte now and then, far slower than the body timeout allows
    slow = [await Connection.open(url) for _ in range(10)]
    user = _bearer("slow-" + uuid.uuid4().hex)
    for connection in slow:
        head = ["POST /scraps HTTP/1.1", "Host: api", "Content-Type: application/json"]
        head += [f"{k}: {v}" for k, v in user.items()] + ["Content-Length: 1000", "", ""]
        connection.writer.write("\r\n".join(head).encode() + b'{"content": "')
        await connection.writer.drain()

    async def all_closed(connections: list[Connection]) -> bool:
        states = [await c.closed_by_server() for c in connections]
        return all(states)

    try:
        # generous deadlines: the limits are 1 s and 2 s; a loaded machine may be slower
        await eventually(
            lambda: all_closed(unfinished), within=30, what="unfinished headers to be closed"
        )
        answers_408 = []
        for connection in slow:
            answer = await asyncio.wait_for(connection.answer(), 30)
            answers_408.append((answer.status, answer.json()["code"]))
        assert answers_408 == [(408, "REQUEST_TIMEOUT")] * len(slow)
        await eventually(lambda: all_closed(slow), within=30, what="slow bodies to be closed")
    finally:
        for connection in [*unfinished, *slow]:
            await connection.aclose()

    assert (await _fresh_get(url, "/healthz")).status == 200
    after = _rss_bytes(pid)
    # 4 x 32 MB of headers were sent: a server that buffered them would grow by 128 MB
    assert after - before < 24 * 1024 * 1024, (before, after)
