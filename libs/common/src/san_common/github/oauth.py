"""GitHub's OAuth web flow with PKCE (S256), at `GITHUB_OAUTH_URL`.

`authorize_url` is where the user's browser goes; GitHub sends it back to the callback with
`code` and our `state`; `exchange_code` trades the code (plus the PKCE verifier only we
know) for an access token.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from urllib.parse import urlencode

import httpx

from san_common.github.client import classify
from san_common.github.errors import GithubPermanentError, GithubTransientError

DEFAULT_SCOPE = "repo"
_ERROR_CODE = re.compile(r"[a-z][a-z_]{0,63}")


def new_state() -> str:
    """An unguessable single-use `state` (256 bits)."""
    return secrets.token_urlsafe(32)


def new_code_verifier() -> str:
    """A PKCE code verifier: 64 unreserved characters (RFC 7636 asks for 43 to 128)."""
    return secrets.token_urlsafe(48)


def code_challenge(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


class GithubOAuth:
    def __init__(
        self,
        oauth_url: str,
        *,
        client_id: str,
        client_secret: str,
        timeout_seconds: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._base = oauth_url.rstrip("/")
        self._client_id = client_id
        self._client_secret = client_secret
        self._http = httpx.AsyncClient(
            timeout=timeout_seconds, transport=transport, headers={"Accept": "application/json"}
        )

    @property
    def configured(self) -> bool:
        return bool(self._client_id and self._client_secret)

    async def aclose(self) -> None:
        await self._http.aclose()

    def authorize_url(
        self, *, state: str, challenge: str, redirect_uri: str | None, scope: str = DEFAULT_SCOPE
    ) -> str:
        query = {
            "client_id": self._client_id,
            "scope": scope,
            "state": state,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            **({"redirect_uri": redirect_uri} if redirect_uri else {}),
        }
        return f"{self._base}/login/oauth/authorize?{urlencode(query)}"

    async def exchange_code(self, *, code: str, verifier: str, redirect_uri: str | None) -> str:
        """The access token for `code`. GitHub reports a bad code with a 200 and an `error`."""
        what = "POST /login/oauth/access_token"
        form = {
            "client_id": self._client_id,
            "client_secret": self._client_secret,
            "code": code,
            "code_verifier": verifier,
            **({"redirect_uri": redirect_uri} if redirect_uri else {}),
        }
        try:
            response = await self._http.post(f"{self._base}/login/oauth/access_token", data=form)
        except httpx.TimeoutException as exc:
            raise GithubTransientError(f"GitHub timed out on {what}") from exc
        except httpx.TransportError as exc:
            raise GithubTransientError(f"GitHub connection failed on {what}") from exc
        if not response.is_success:
            raise classify(response, what, self._client_secret)
        try:
            body = response.json()
        except ValueError as exc:
            raise GithubTransientError(
                f"GitHub answered {what} with a body that is not JSON"
            ) from exc
        if not isinstance(body, dict):
            raise GithubPermanentError(f"GitHub answered {what} with no object")
        if body.get("error"):
            raw = str(body["error"])
            refused = GithubPermanentError(f"GitHub refused the authorization code: {raw[:80]}")
            # GitHub's error codes are a fixed vocabulary (bad_verification_code, …): shown to
            # the user when the answer holds one, never other text
            code = raw if _ERROR_CODE.fullmatch(raw) else "unrecognized error"
            refused.public_reason = f"GitHub refused the authorization code ({code})"
            raise refused
        token = body.get("access_token")
        if not isinstance(token, str) or not token:
            raise GithubPermanentError(f"GitHub answered {what} without an access token")
        return token
