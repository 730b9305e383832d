"""The GitHub clients and the token cipher the API uses, built once by `create_app`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request

from san_api.settings import ApiSettings
from san_common.crypto import TokenCipher
from san_common.github import GithubClient, GithubOAuth


@dataclass(frozen=True)
class GithubServices:
    api: GithubClient
    oauth: GithubOAuth
    cipher: TokenCipher

    @classmethod
    def from_settings(
        cls, settings: ApiSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> GithubServices:
        return cls(
            api=GithubClient(
                settings.github_api_url,
                timeout_seconds=settings.github_timeout_seconds,
                transport=transport,
            ),
            oauth=GithubOAuth(
                settings.github_oauth_url,
                client_id=settings.github_client_id,
                client_secret=settings.github_client_secret,
                timeout_seconds=settings.github_timeout_seconds,
                transport=transport,
            ),
            cipher=TokenCipher.from_setting(settings.token_encryption_keys),
        )

    async def aclose(self) -> None:
        await self.api.aclose()
        await self.oauth.aclose()


async def get_github(request: Request) -> GithubServices:
    services: GithubServices = request.app.state.github
    return services


GithubDep = Annotated[GithubServices, Depends(get_github)]
