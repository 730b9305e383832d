"""Linking a GitHub account and connecting repositories (docs/reference/job-rules.md §4).

A token is validated with `GET /user` before it is stored, and stored only encrypted,
bound to the user (san_common.crypto). A repository is checked with `GET /repos/{o}/{r}`:
it must exist for the token and allow push; it is stored as GitHub spells it.
"""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from san_api import errors
from san_api.github import repository
from san_api.github.clients import GithubServices
from san_api.github.schemas import RepositoryCreate
from san_api.github.upstream import github_errors
from san_common.crypto import DecryptionFailed, Purpose
from san_common.models import GithubAccount, GithubRepository


async def link(
    session: AsyncSession, github: GithubServices, user_id: uuid.UUID, token: str
) -> GithubAccount:
    with github_errors():
        user = await github.api.get_user(token)
    return await repository.upsert_account(
        session,
        user_id,
        login=user.login,
        github_user_id=user.id,
        encrypted_token=github.cipher.encrypt(token, user_id=user_id, purpose=Purpose.GITHUB_TOKEN),
    )


async def get_account(session: AsyncSession, user_id: uuid.UUID) -> GithubAccount:
    account = await repository.get_account(session, user_id)
    if account is None:
        raise errors.NotFound("no GitHub account is linked")
    return account


async def unlink(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Forget the token. Connected repositories stay, for when the user links again."""
    if not await repository.delete_account(session, user_id):
        raise errors.NotFound("no GitHub account is linked")


async def linked_account(session: AsyncSession, user_id: uuid.UUID) -> GithubAccount:
    """The account a GitHub operation needs; GITHUB_NOT_LINKED (400) without one."""
    account = await repository.get_account(session, user_id)
    if account is None:
        raise errors.GithubNotLinked("link GitHub with PUT /me/github or the OAuth flow first")
    return account


def token_of(github: GithubServices, account: GithubAccount) -> str:
    try:
        return github.cipher.decrypt(
            account.encrypted_token, user_id=account.user_id, purpose=Purpose.GITHUB_TOKEN
        )
    except DecryptionFailed:
        raise errors.GithubTokenRejected(
            "the stored token cannot be decrypted: relink GitHub"
        ) from None


async def connect_repository(
    session: AsyncSession, github: GithubServices, user_id: uuid.UUID, body: RepositoryCreate
) -> GithubRepository:
    token = token_of(github, await linked_account(session, user_id))
    missing = errors.GithubRepositoryNotFound(f"{body.owner}/{body.name} was not found on GitHub")
    with github_errors(not_found=missing):
        found = await github.api.get_repository(token, body.owner, body.name)
    if not found.can_push:
        raise errors.RepositoryNotWritable(f"the token may not push to {found.owner}/{found.name}")
    created = await repository.insert_repository(
        session,
        user_id,
        owner=found.owner,
        name=found.name,
        branch=body.branch,
        directory=body.directory,
    )
    if created is None:
        raise errors.DuplicateResource(f"{found.owner}/{found.name} is already connected")
    return created


async def list_repositories(session: AsyncSession, user_id: uuid.UUID) -> list[GithubRepository]:
    return await repository.list_repositories(session, user_id)


async def disconnect_repository(
    session: AsyncSession, user_id: uuid.UUID, repository_id: uuid.UUID
) -> None:
    if not await repository.delete_repository(session, user_id, repository_id):
        raise errors.NotFound(f"repository {repository_id} not found")
