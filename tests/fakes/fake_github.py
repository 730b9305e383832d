"""A fake GitHub (REST API and OAuth web flow) on loopback, with switchable faults.

    with FakeGithub() as github:
        token = github.add_user("alice")
        github.add_repo("alice", "til", pushers={"alice"})
        client = GithubClient(github.api_url)
        github.add_fault("drop_response", method="PUT")

It really listens on 127.0.0.1 in a background thread, so the real HTTP client code runs.
The API lives under `/api/v3` (as on GitHub Enterprise, which proves base paths are kept);
OAuth lives at the root, as on github.com. GitHub semantics it keeps:

- `GET /user`; 401 `Bad credentials` for unknown or revoked tokens;
- `GET /repos/{o}/{r}` with `permissions`; private repositories are 404 to strangers;
- `GET /repos/{o}/{r}/contents/{path}?ref=` (file, directory listing, or 404);
- `PUT …/contents/{path}`: 201 on create, 200 on update, 422 when `sha` is missing for an
  existing file, 409 when `sha` is stale, 403 without push permission; file `sha` is the git
  blob sha, sha1(`blob {len}\\0` + content);
- `GET /repos/{o}/{r}/commits?path=&sha=&per_page=` newest first;
- `GET /user/starred?per_page=&page=` with a `Link` header (`next`, `last`, …), at most 100
  per page;
- `x-ratelimit-*` headers on every API answer, counted per token in a window (5,000 an
  hour; `rate_limit` narrows it); past the limit, 403 `API rate limit exceeded` with
  `x-ratelimit-remaining: 0`, the request not applied;
- `GET /login/oauth/authorize` (302 to the redirect URI with `code` and `state`) and
  `POST /login/oauth/access_token`, which checks the client, the single-use code and PKCE
  (S256); errors come back as a 200 with an `error` field, as GitHub does.

Tokens look like `fake_<40 hex>`: deliberately not like real GitHub tokens, so that tests
prove tokens are never written anywhere, not merely that a log redactor caught them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import secrets
import socket
import struct
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from tests.fakes.loopback import LoopbackHTTPServer, LoopbackServer

API_PREFIX = "/api/v3"

FaultKind = Literal[
    "drop_response",  # apply the request, then reset the connection instead of answering
    "reset",  # reset the connection without applying anything
    "timeout",  # hold the request for `delay_seconds`, then close without an answer
    "http_500",
    "http_429",  # 429 with `retry-after`
    "http_403_retry_after",  # secondary rate limit: 403 with `retry-after`
    "http_403_reset",  # primary rate limit: 403, `x-ratelimit-remaining: 0`, `…-reset`
    "http_422_echo",  # a 422 whose message echoes the Authorization header it received
    "http_403",  # no access: 403, no rate-limit headers, `error_detail` appended to its message
]


def blob_sha(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class FakeCommit:
    sha: str
    branch: str
    path: str
    message: str
    blob_sha: str
    html_url: str


@dataclass
class FakeRepo:
    owner: str
    name: str
    default_branch: str = "main"
    private: bool = False
    pushers: set[str] = field(default_factory=set)
    branches: dict[str, dict[str, bytes]] = field(default_factory=dict)
    commits: list[FakeCommit] = field(default_factory=list)


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    token: str | None
    at: float  # time.monotonic() on arrival
    wall: float  # time.time() on arrival
    status: int | None  # None when no answer was sent (dropped, reset, timeout)


@dataclass
class _Fault:
    kind: FaultKind
    times: int | None
    token: str | None
    method: str | None
    path_contains: str | None
    retry_after: str
    reset_in: float

    def matches(self, method: str, path: str, token: str | None) -> bool:
        return (
            (self.token is None or self.token == token)
            and (self.method is None or self.method == method)
            and (self.path_contains is None or self.path_contains in path)
        )


@dataclass
class _Grant:
    token: str
    challenge: str | None
    redirect_uri: str | None
    used: bool = False


class FakeGithub(LoopbackServer):
    def __init__(
        self, *, client_id: str = "fake-client-id", client_secret: str = "fake-client-secret"
    ) -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.delay_seconds = 5.0  # how long the "timeout" fault holds a request
        self.put_delay_seconds = 0.0  # widen PUTs so overlapping mutations would show
        self.error_detail = ""  # appended to the message of "http_403"
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}  # token → login
        self._user_ids: dict[str, int] = {}
        self._revoked: set[str] = set()
        self._repos: dict[tuple[str, str], FakeRepo] = {}
        self._stars: dict[str, list[dict[str, Any]]] = {}
        self._faults: list[_Fault] = []
        self._requests: list[RecordedRequest] = []
        self._limit = 5000
        self._reset_at = time.time() + 3600
        self._remaining: dict[str, int] = {}
        self.over_limit = 0  # requests answered 403 because the window's limit was spent
        self._in_flight: dict[str, int] = defaultdict(int)
        self._max_in_flight: dict[str, int] = defaultdict(int)
        self._grants: dict[str, _Grant] = {}
        self._authorizing: str | None = None
        super().__init__(_Handler)

    @property
    def api_url(self) -> str:
        return self.origin + API_PREFIX

    @property
    def oauth_url(self) -> str:
        return self.origin

    # -- world -----------------------------------------------------------------------------

    def add_user(self, login: str | None = None) -> str:
        """A new token for `login` (a new user unless the login exists)."""
        login = login or f"user{secrets.token_hex(5)}"
        token = "fake_" + secrets.token_hex(20)
        with self._lock:
            self._tokens[token] = login
            self._user_ids.setdefault(login, 1000 + len(self._user_ids))
        return token

    def login_of(self, token: str) -> str:
        with self._lock:
            return self._tokens[token]

    def revoke(self, token: str) -> None:
        with self._lock:
            self._revoked.add(token)

    @property
    def issued_tokens(self) -> list[str]:
        with self._lock:
            return list(self._tokens)

    def add_repo(
        self,
        owner: str,
        name: str,
        *,
        pushers: set[str] | None = None,
        private: bool = False,
        default_branch: str = "main",
        branches: tuple[str, ...] = (),
    ) -> FakeRepo:
        repo = FakeRepo(
            owner, name, default_branch, private, {owner} if pushers is None else set(pushers)
        )
        for branch in (default_branch, *branches):
            repo.branches[branch] = {}
        with self._lock:
            self._repos[(owner.lower(), name.lower())] = repo
        return repo

    def commit_file(
        self, owner: str, name: str, path: str, content: bytes, *, branch: str | None = None
    ) -> FakeCommit:
        """Put a file there as if someone had committed it."""
        with self._lock:
            repo = self._repos[(owner.lower(), name.lower())]
            return self._apply_put(repo, branch or repo.default_branch, path, content, "seed")

    def file(self, owner: str, name: str, path: str, *, branch: str | None = None) -> bytes | None:
        with self._lock:
            repo = self._repos[(owner.lower(), name.lower())]
            return repo.branches[branch or repo.default_branch].get(path)

    def commits_for(self, owner: str, name: str, path: str) -> list[FakeCommit]:
        with self._lock:
            repo = self._repos[(owner.lower(), name.lower())]
            return [c for c in repo.commits if c.path == path]

    def set_stars(self, login: str, repos: list[dict[str, Any]]) -> None:
        with self._lock:
            self._stars[login] = list(repos)

    def authorize_as(self, token: str) -> None:
        """The user 'signed in' at the fake when the next browser reaches /login/oauth/authorize."""
        with self._lock:
            self._authorizing = token

    # -- faults and records ------------------------------------------------------------------

    def add_fault(
        self,
        kind: FaultKind,
        *,
        times: int | None = 1,
        token: str | None = None,
        method: str | None = None,
        path_contains: str | None = None,
        retry_after: str = "2",
        reset_in: float = 2.0,
    ) -> None:
        """Inject `kind` into the next `times` matching requests (None: every one)."""
        with self._lock:
            self._faults.append(
                _Fault(kind, times, token, method, path_contains, retry_after, reset_in)
            )

    def rate_limit(self, limit: int, *, reset_in: float) -> float:
        """Every token may make `limit` API calls until `reset_in` seconds from now, then
        5,000 an hour again. Returns the reset's time (epoch seconds, whole, as GitHub
        announces it)."""
        with self._lock:
            self._limit = limit
            self._reset_at = float(math.ceil(time.time() + reset_in))
            self._remaining.clear()
            return self._reset_at

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def requests_with(self, token: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.token == token]

    def max_concurrent_mutations(self, token: str | None = None) -> int:
        """The most PUTs ever in flight at once for `token` (None: for all tokens together)."""
        with self._lock:
            return self._max_in_flight[token or "*"]

    # -- internals (called from the handler thread) -------------------------------------------

    def _record(self, request: RecordedRequest) -> int:
        with self._lock:
            self._requests.append(request)
            return len(self._requests) - 1

    def _set_status(self, index: int, status: int | None) -> None:
        with self._lock:
            self._requests[index] = _replace_status(self._requests[index], status)

    def _spend(self, token: str | None) -> tuple[int, int, float]:
        """One call of `token`'s window: (limit, remaining after it, reset); remaining is
        -1 when the window had none left."""
        with self._lock:
            now = time.time()
            if now >= self._reset_at:
                self._limit, self._reset_at = 5000, float(math.ceil(now + 3600))
                self._remaining.clear()
            key = token or "-"
            left = self._remaining.get(key, self._limit)
            self._remaining[key] = max(0, left - 1)
            return self._limit, left - 1, self._reset_at

    def _take_fault(self, method: str, path: str, token: str | None) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path, token):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def _apply_put(
        self, repo: FakeRepo, branch: str, path: str, content: bytes, message: str
    ) -> FakeCommit:
        repo.branches[branch][path] = content
        sha = hashlib.sha1(
            f"{repo.owner}/{repo.name}@{time.time_ns()}:{secrets.token_hex(4)}".encode()
        ).hexdigest()
        commit = FakeCommit(
            sha=sha,
            branch=branch,
            path=path,
            message=message,
            blob_sha=blob_sha(content),
            html_url=f"{self.origin}/{repo.owner}/{repo.name}/commit/{sha}",
        )
        repo.commits.append(commit)
        return commit


def _replace_status(request: RecordedRequest, status: int | None) -> RecordedRequest:
    return RecordedRequest(
        request.method, request.path, request.query, request.token, request.at, request.wall, status
    )


class _Reply(Exception):
    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.status, self.body, self.headers = status, body, headers or {}


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackHTTPServer[FakeGithub]
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # -- plumbing --------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        split = urlsplit(self.path)
        path = unquote(split.path)
        query = dict(parse_qsl(split.query))
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        token = self._token()
        index = fake._record(
            RecordedRequest(method, path, query, token, time.monotonic(), time.time(), None)
        )
        rate = fake._spend(token) if path.startswith(API_PREFIX) else (0, 0, 0.0)
        if rate[1] < 0:
            fake.over_limit += 1
            fake._set_status(index, 403)
            limit, _, reset_at = rate
            self._send(
                403,
                {"message": "API rate limit exceeded for user."},
                self._rate_headers((limit, 0, reset_at)),
            )
            return
        fault = fake._take_fault(method, path, token)
        if fault is not None and fault.kind in ("reset", "timeout"):
            if fault.kind == "timeout":
                fake._stopping.wait(fake.delay_seconds)
            self._reset()
            return
        try:
            if fault is not None and fault.kind != "drop_response":
                self._fault_reply(fault)
            status, payload, headers = self._route(method, path, query, body, token)
        except _Reply as reply:
            status, payload, headers = reply.status, reply.body, reply.headers
        if fault is not None and fault.kind == "drop_response":
            self._reset()
            return
        fake._set_status(index, status)
        if path.startswith(API_PREFIX):
            headers = {**self._rate_headers(rate), **headers}
        self._send(status, payload, headers)

    def _fault_reply(self, fault: _Fault) -> None:
        if fault.kind == "http_500":
            raise _Reply(500, {"message": "Server Error"})
        if fault.kind == "http_429":
            raise _Reply(429, {"message": "Too Many Requests"}, {"retry-after": fault.retry_after})
        if fault.kind == "http_403_retry_after":
            raise _Reply(
                403,
                {"message": "You have exceeded a secondary rate limit. Please wait a few minutes."},
                {"retry-after": fault.retry_after},
            )
        if fault.kind == "http_403_reset":
            reset = int(time.time() + fault.reset_in)
            raise _Reply(
                403,
                {"message": "API rate limit exceeded for user."},
                {
                    "x-ratelimit-remaining": "0",
                    "x-ratelimit-reset": str(reset),
                    "x-ratelimit-limit": "5000",
                },
            )
        if fault.kind == "http_403":
            message = (
                "Resource not accessible by personal access token" + self.server.fake.error_detail
            )
            raise _Reply(403, {"message": message})
        if fault.kind == "http_422_echo":
            seen = self.headers.get("authorization", "")
            raise _Reply(422, {"message": f"Validation Failed for request with {seen}"})

    def _token(self) -> str | None:
        header = self.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return value.strip() if scheme.lower() in ("bearer", "token") and value.strip() else None

    def _reset(self) -> None:
        """Close with RST: the client sees a connection reset, not an answer."""
        self.close_connection = True
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass

    def _rate_headers(self, rate: tuple[int, int, float]) -> dict[str, str]:
        limit, remaining, reset_at = rate
        return {
            "x-ratelimit-limit": str(limit),
            "x-ratelimit-remaining": str(remaining),
            "x-ratelimit-used": str(limit - remaining),
            "x-ratelimit-reset": str(int(reset_at)),
            "x-ratelimit-resource": "core",
        }

    def _send(self, status: int, payload: Any, headers: dict[str, str]) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("content-type", "application/json; charset=utf-8")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    # -- routes ----------------------------------------------------------------------------

    def _route(
        self, method: str, path: str, query: dict[str, str], body: bytes, token: str | None
    ) -> tuple[int, Any, dict[str, str]]:
        if path == "/login/oauth/authorize" and method == "GET":
            return self._oauth_authorize(query)
        if path == "/login/oauth/access_token" and method == "POST":
            return self._oauth_token(body)
        if not path.startswith(API_PREFIX + "/"):
            raise _Reply(404, {"message": "Not Found"})
        route = path[len(API_PREFIX) :].strip("/").split("/")
        login = self._login(token)
        if route == ["user"] and method == "GET":
            fake = self.server.fake
            return 200, {"login": login, "id": fake._user_ids[login], "type": "User"}, {}
        if route == ["user", "starred"] and method == "GET":
            return self._starred(login, query)
        if len(route) >= 3 and route[0] == "repos":
            repo = self._repo(route[1], route[2], login)
            rest = route[3:]
            if not rest and method == "GET":
                return 200, self._repo_json(repo, login), {}
            if rest[:1] == ["contents"] and len(rest) > 1:
                file_path = "/".join(rest[1:])
                if method == "GET":
                    return self._get_contents(repo, file_path, query)
                if method == "PUT":
                    return self._put_contents(repo, file_path, body, login, token)
            if rest == ["commits"] and method == "GET":
                return self._commits(repo, query)
        raise _Reply(404, {"message": "Not Found"})

    def _login(self, token: str | None) -> str:
        fake = self.server.fake
        with fake._lock:
            login = fake._tokens.get(token or "")
            revoked = token in fake._revoked
        if login is None or revoked:
            raise _Reply(401, {"message": "Bad credentials", "status": "401"})
        return login

    def _repo(self, owner: str, name: str, login: str) -> FakeRepo:
        fake = self.server.fake
        with fake._lock:
            repo = fake._repos.get((owner.lower(), name.lower()))
        if repo is None or (repo.private and login not in repo.pushers):
            raise _Reply(404, {"message": "Not Found"})
        return repo

    def _repo_json(self, repo: FakeRepo, login: str) -> dict[str, Any]:
        full = f"{repo.owner}/{repo.name}"
        return {
            "name": repo.name,
            "full_name": full,
            "owner": {"login": repo.owner},
            "private": repo.private,
            "default_branch": repo.default_branch,
            "html_url": f"{self.server.fake.origin}/{full}",
            "permissions": {
                "admin": login == repo.owner,
                "push": login in repo.pushers,
                "pull": True,
            },
        }

    def _file_json(self, repo: FakeRepo, branch: str, path: str, content: bytes) -> dict[str, Any]:
        origin = self.server.fake.origin
        return {
            "type": "file",
            "encoding": "base64",
            "size": len(content),
            "name": path.rsplit("/", 1)[-1],
            "path": path,
            "content": base64.encodebytes(content).decode(),
            "sha": blob_sha(content),
            "html_url": f"{origin}/{repo.owner}/{repo.name}/blob/{branch}/{path}",
            "_links": {"html": f"{origin}/{repo.owner}/{repo.name}/blob/{branch}/{path}"},
        }

    def _get_contents(
        self, repo: FakeRepo, path: str, query: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        branch = query.get("ref") or repo.default_branch
        with self.server.fake._lock:
            files = dict(repo.branches.get(branch) or {}) if branch in repo.branches else None
        if files is None:
            raise _Reply(404, {"message": f"No commit found for the ref {branch}"})
        if path in files:
            return 200, self._file_json(repo, branch, path, files[path]), {}
        prefix = path.rstrip("/") + "/"
        children = sorted({p[len(prefix) :].split("/")[0] for p in files if p.startswith(prefix)})
        if children:
            return 200, [{"type": "file", "name": c, "path": prefix + c} for c in children], {}
        raise _Reply(404, {"message": "Not Found"})

    def _put_contents(
        self, repo: FakeRepo, path: str, body: bytes, login: str, token: str | None
    ) -> tuple[int, Any, dict[str, str]]:
        fake = self.server.fake
        keys = (token or "-", "*")  # per token, and across all tokens
        with fake._lock:
            for key in keys:
                fake._in_flight[key] += 1
                fake._max_in_flight[key] = max(fake._max_in_flight[key], fake._in_flight[key])
        try:
            if fake.put_delay_seconds:
                fake._stopping.wait(fake.put_delay_seconds)
            return self._put_locked(repo, path, body, login)
        finally:
            with fake._lock:
                for key in keys:
                    fake._in_flight[key] -= 1

    def _put_locked(
        self, repo: FakeRepo, path: str, body: bytes, login: str
    ) -> tuple[int, Any, dict[str, str]]:
        fake = self.server.fake
        if login not in repo.pushers:
            raise _Reply(403, {"message": "Resource not accessible by personal access token"})
        try:
            data = json.loads(body or b"{}")
            message, encoded = data["message"], data["content"]
            content = base64.b64decode(encoded, validate=True)
        except (ValueError, KeyError, TypeError):
            raise _Reply(
                422, {"message": 'Invalid request.\n\n"content" and "message" are required.'}
            ) from None
        branch = data.get("branch") or repo.default_branch
        with fake._lock:
            if branch not in repo.branches:
                raise _Reply(404, {"message": f"Branch {branch} not found"})
            existing = repo.branches[branch].get(path)
            sha = data.get("sha")
            if existing is not None and not sha:
                raise _Reply(422, {"message": 'Invalid request.\n\n"sha" wasn\'t supplied.'})
            if (existing is None and sha) or (existing is not None and sha != blob_sha(existing)):
                raise _Reply(409, {"message": f"{path} does not match {sha}"})
            commit = fake._apply_put(repo, branch, path, content, str(message))
        return (
            200 if existing is not None else 201,
            {
                "content": self._file_json(repo, branch, path, content),
                "commit": {
                    "sha": commit.sha,
                    "html_url": commit.html_url,
                    "message": commit.message,
                },
            },
            {},
        )

    def _commits(self, repo: FakeRepo, query: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        branch = query.get("sha") or repo.default_branch
        path = query.get("path")
        per_page = min(100, int(query.get("per_page") or 30))
        with self.server.fake._lock:
            commits = [
                c
                for c in reversed(repo.commits)
                if c.branch == branch and (path is None or c.path == path)
            ]
        return (
            200,
            [
                {"sha": c.sha, "html_url": c.html_url, "commit": {"message": c.message}}
                for c in commits[:per_page]
            ],
            {},
        )

    def _starred(self, login: str, query: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        fake = self.server.fake
        with fake._lock:
            stars = list(fake._stars.get(login, []))
        per_page = max(1, min(100, int(query.get("per_page") or 30)))
        page = max(1, int(query.get("page") or 1))
        last = max(1, -(-len(stars) // per_page))
        chunk = stars[(page - 1) * per_page : page * per_page]
        base = f"{fake.api_url}/user/starred"

        def link(n: int, rel: str) -> str:
            return f'<{base}?{urlencode({"per_page": per_page, "page": n})}>; rel="{rel}"'

        links = []
        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links += [link(1, "first"), link(page - 1, "prev")]
        return 200, chunk, ({"link": ", ".join(links)} if links else {})

    # -- OAuth -----------------------------------------------------------------------------

    def _oauth_authorize(self, query: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        fake = self.server.fake
        if query.get("client_id") != fake.client_id:
            raise _Reply(404, {"message": "unknown client_id"})
        with fake._lock:
            token = fake._authorizing
        if token is None:
            raise _Reply(403, {"message": "nobody is signed in at the fake GitHub"})
        if query.get("code_challenge") and query.get("code_challenge_method") != "S256":
            raise _Reply(400, {"message": "only S256 is supported"})
        code = "code_" + secrets.token_hex(10)
        redirect_uri = query.get("redirect_uri")
        with fake._lock:
            fake._grants[code] = _Grant(token, query.get("code_challenge"), redirect_uri)
        target = redirect_uri or f"{fake.origin}/callback"
        location = f"{target}?{urlencode({'code': code, 'state': query.get('state', '')})}"
        return 302, None, {"location": location}

    def _oauth_token(self, body: bytes) -> tuple[int, Any, dict[str, str]]:
        fake = self.server.fake
        content_type = self.headers.get("content-type", "")
        form = json.loads(body) if "json" in content_type else dict(parse_qsl(body.decode()))
        if (
            form.get("client_id") != fake.client_id
            or form.get("client_secret") != fake.client_secret
        ):
            return 200, {"error": "incorrect_client_credentials"}, {}
        with fake._lock:
            grant = fake._grants.get(form.get("code", ""))
            if grant is None or grant.used:
                return 200, {"error": "bad_verification_code"}, {}
            if grant.redirect_uri and form.get("redirect_uri") != grant.redirect_uri:
                return 200, {"error": "redirect_uri_mismatch"}, {}
            verifier = form.get("code_verifier", "")
            expected = (
                base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
                .decode()
                .rstrip("=")
            )
            if grant.challenge and expected != grant.challenge:
                return (
                    200,
                    {
                        "error": "bad_verification_code",
                        "error_description": "PKCE verification failed",
                    },
                    {},
                )
            grant.used = True
        return 200, {"access_token": grant.token, "token_type": "bearer", "scope": "repo"}, {}
