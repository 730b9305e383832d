"""A small GitHub REST client over httpx, shared by the API, the github-worker and the
ai-worker (docs/reference/job-rules.md §8): the user, a repository, a file's contents (read and
write), the commits of a path, and the user's stars (following `Link` pagination).

Every method takes the user's token and sends it only in the `Authorization` header, only
to the configured `GITHUB_API_URL` origin. Failures raise the classes of
`san_common.github.errors`.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from san_common import quotas
from san_common.errors import redact
from san_common.github.errors import (
    GithubNotFound,
    GithubPermanentError,
    GithubRateLimited,
    GithubTokenRejected,
    GithubTransientError,
)

API_VERSION = "2022-11-28"
STARS_PER_PAGE = 100
# GitHub's advice for a secondary rate limit that names no wait: at least a minute.
DEFAULT_RATE_LIMIT_WAIT = 60.0


@dataclass(frozen=True, slots=True)
class GithubUser:
    login: str
    id: int | None


@dataclass(frozen=True, slots=True)
class GithubRepo:
    owner: str
    name: str
    default_branch: str | None
    can_push: bool


@dataclass(frozen=True, slots=True)
class ContentEntry:
    """What is at a path: a file (with its git blob sha) or something else (a directory…)."""

    path: str
    type: str
    sha: str | None
    html_url: str | None


@dataclass(frozen=True, slots=True)
class CommitRef:
    sha: str
    html_url: str | None


@dataclass(frozen=True, slots=True)
class StarredRepo:
    full_name: str
    description: str | None
    topics: tuple[str, ...]
    language: str | None
    html_url: str


def git_blob_sha(content: bytes) -> str:
    """The sha GitHub reports for a file with this content (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content, usedforsecurity=False).hexdigest()


class GithubClient:
    def __init__(
        self,
        api_url: str,
        *,
        timeout_seconds: float = 30.0,
        max_star_pages: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
        upstream_quotas: quotas.Quotas | None = None,
    ) -> None:
        self._api = httpx.URL(api_url.rstrip("/") + "/")
        # Shared by every worker of the deployment (san_common.quotas); off in the API,
        # whose few calls a user waits on.
        self._quotas = upstream_quotas or quotas.NoQuotas()
        self._max_star_pages = max_star_pages
        self._clock = clock
        self._http = httpx.AsyncClient(
            timeout=timeout_seconds,
            transport=transport,
            follow_redirects=False,
            headers={
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION,
                "User-Agent": "san-github-client",
            },
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def get_user(self, token: str) -> GithubUser:
        body = await self._json("GET", "user", token)
        login = body.get("login") if isinstance(body, dict) else None
        if not isinstance(login, str) or not login:
            raise GithubPermanentError("GitHub answered GET /user without a login")
        user_id = body.get("id")
        return GithubUser(login, user_id if isinstance(user_id, int) else None)

    async def get_repository(self, token: str, owner: str, name: str) -> GithubRepo:
        body = await self._json("GET", _repo_path(owner, name), token)
        if not isinstance(body, dict):
            raise GithubPermanentError(f"GitHub answered GET /repos/{owner}/{name} with no object")
        permissions = body.get("permissions") or {}
        spelled_owner = (body.get("owner") or {}).get("login") or owner
        return GithubRepo(
            owner=spelled_owner,
            name=body.get("name") or name,
            default_branch=body.get("default_branch"),
            can_push=bool(permissions.get("push")),
        )

    async def get_contents(
        self, token: str, owner: str, name: str, path: str, *, ref: str | None = None
    ) -> ContentEntry | None:
        """What is at `path` (on `ref`), or None when nothing is."""
        try:
            body = await self._json(
                "GET", _contents_path(owner, name, path), token, params=_ref_param(ref)
            )
        except GithubNotFound:
            return None
        if isinstance(body, list):
            return ContentEntry(path, "dir", None, None)
        if not isinstance(body, dict):
            raise GithubPermanentError(f"GitHub answered GET contents of {path} with no object")
        return ContentEntry(
            path=body.get("path") or path,
            type=body.get("type") or "file",
            sha=body.get("sha"),
            html_url=body.get("html_url"),
        )

    async def put_contents(
        self,
        token: str,
        owner: str,
        name: str,
        path: str,
        *,
        content: bytes,
        message: str,
        branch: str | None = None,
        sha: str | None = None,
    ) -> CommitRef:
        """Create (or, with the current blob `sha`, update) a file: one commit."""
        payload: dict[str, Any] = {
            "message": message,
            "content": base64.b64encode(content).decode("ascii"),
        }
        if branch:
            payload["branch"] = branch
        if sha:
            payload["sha"] = sha
        body = await self._json("PUT", _contents_path(owner, name, path), token, json=payload)
        commit = body.get("commit") if isinstance(body, dict) else None
        if not isinstance(commit, dict) or not isinstance(commit.get("sha"), str):
            raise GithubTransientError(f"GitHub answered PUT contents of {path} without a commit")
        return CommitRef(commit["sha"], commit.get("html_url"))

    async def last_commit_for_path(
        self, token: str, owner: str, name: str, path: str, *, ref: str | None = None
    ) -> CommitRef | None:
        params = {"path": path, "per_page": "1", **({"sha": ref} if ref else {})}
        body = await self._json("GET", f"{_repo_path(owner, name)}/commits", token, params=params)
        if not isinstance(body, list) or not body or not isinstance(body[0], dict):
            return None
        first = body[0]
        return CommitRef(str(first.get("sha")), first.get("html_url"))

    async def starred(self, token: str) -> list[StarredRepo]:
        """Every repository the user starred, page by page (`Link: rel="next"`)."""
        stars: list[StarredRepo] = []
        url: httpx.URL | None = self._api.join("user/starred")
        params: dict[str, str] | None = {"per_page": str(STARS_PER_PAGE)}
        for _ in range(self._max_star_pages):
            assert url is not None
            response = await self._send("GET", url, token, params=params)
            page = _decode(response, "GET /user/starred")
            if not isinstance(page, list):
                raise GithubPermanentError("GitHub answered GET /user/starred with no list")
            stars.extend(s for s in (_starred(item) for item in page) if s is not None)
            url = self._next_page(response)
            params = None  # the next link carries its own query
            if url is None:
                return stars
        return stars  # bounded: a pathological account stops at max_star_pages pages

    def _next_page(self, response: httpx.Response) -> httpx.URL | None:
        link = response.links.get("next", {}).get("url")
        if not link:
            return None
        url = httpx.URL(link)
        if (url.scheme, url.host, url.port) != (self._api.scheme, self._api.host, self._api.port):
            # The token goes to the configured origin only, whatever a Link header says.
            raise GithubPermanentError("GitHub's next-page link points to another host")
        return url

    async def _json(
        self,
        method: str,
        path: str,
        token: str,
        *,
        params: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
    ) -> Any:
        response = await self._send(method, self._api.join(path), token, params=params, json=json)
        return _decode(response, f"{method} /{path}")

    async def _send(
        self,
        method: str,
        url: httpx.URL,
        token: str,
        *,
        params: dict[str, str] | None = None,
        json: dict[str, Any] | None = None,
    ) -> httpx.Response:
        what = f"{method} {url.path}"
        async with self._quotas.call(quotas.github_key(str(self._api), token)) as ticket:
            try:
                response = await self._http.request(
                    method,
                    url,
                    params=params,
                    json=json,
                    headers={"Authorization": f"Bearer {token}"},
                )
            except httpx.TimeoutException as exc:
                raise GithubTransientError(f"GitHub timed out on {what}") from exc
            except httpx.TransportError as exc:
                raise GithubTransientError(
                    f"GitHub connection failed on {what} ({type(exc).__name__})"
                ) from exc
            ticket.answered(
                quotas.github_answer(response.headers, response.status_code, self._clock())
            )
        if response.is_success:
            return response
        raise classify(response, what, token, now=self._clock())


def classify(
    response: httpx.Response, what: str, token: str = "", *, now: float | None = None
) -> Exception:
    """The error for a non-2xx GitHub answer (see the module doc of github.errors)."""
    status = response.status_code
    detail = _github_message(response, token)
    message = f"GitHub answered {status} to {what}" + (f": {detail}" if detail else "")
    if status == 401:
        return GithubTokenRejected()
    if status in (403, 429):
        wait = rate_limit_wait(response, time.time() if now is None else now)
        if wait is None and (status == 429 or "rate limit" in detail.lower()):
            wait = DEFAULT_RATE_LIMIT_WAIT
        if wait is not None:
            return GithubRateLimited(message, status=status, retry_after=wait)
        return GithubPermanentError(message, status=status)
    if status == 404:
        return GithubNotFound(message, status=status)
    if status == 408 or status >= 500:
        return GithubTransientError(message, status=status)
    return GithubPermanentError(message, status=status)


def rate_limit_wait(response: httpx.Response, now: float) -> float | None:
    """Seconds GitHub asked us to wait: `retry-after` (seconds or HTTP date) first, else the
    reset time of an exhausted primary limit; None when the answer names no wait."""
    retry_after = response.headers.get("retry-after", "").strip()
    if retry_after:
        try:
            seconds = float(retry_after)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(retry_after).timestamp() - now
            except (TypeError, ValueError):
                seconds = math.nan
        if math.isfinite(seconds):
            return max(0.0, seconds)
    if response.headers.get("x-ratelimit-remaining", "").strip() == "0":
        try:
            reset = float(response.headers.get("x-ratelimit-reset", ""))
        except ValueError:
            return None
        if math.isfinite(reset):
            return max(0.0, reset - now)
    return None


def _decode(response: httpx.Response, what: str) -> Any:
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise GithubTransientError(f"GitHub answered {what} with a body that is not JSON") from exc


def _github_message(response: httpx.Response, token: str) -> str:
    try:
        body = response.json()
        text = str(body.get("message", "")) if isinstance(body, dict) else ""
    except ValueError:
        text = response.text
    text = " ".join(text.split())
    text = text if len(text) <= 300 else text[:299] + "…"
    return redact(text, (token,))


def _starred(item: Any) -> StarredRepo | None:
    if not isinstance(item, dict):
        return None
    # `application/vnd.github.star+json` wraps each repository in {"starred_at", "repo"}.
    repo: dict[str, Any] = item["repo"] if isinstance(item.get("repo"), dict) else item
    full_name = repo.get("full_name")
    if not isinstance(full_name, str) or not full_name:
        return None
    topics = repo.get("topics") or []
    return StarredRepo(
        full_name=full_name,
        description=repo.get("description") if isinstance(repo.get("description"), str) else None,
        topics=tuple(t for t in topics if isinstance(t, str)),
        language=repo.get("language") if isinstance(repo.get("language"), str) else None,
        html_url=repo.get("html_url") or f"https://github.com/{full_name}",
    )


def _repo_path(owner: str, name: str) -> str:
    return f"repos/{quote(owner, safe='')}/{quote(name, safe='')}"


def _contents_path(owner: str, name: str, path: str) -> str:
    return f"{_repo_path(owner, name)}/contents/{quote(path.strip('/'), safe='/')}"


def _ref_param(ref: str | None) -> dict[str, str] | None:
    return {"ref": ref} if ref else None
