"""Helpers of the GitHub suite: people with a bearer token and a GitHub token, linking and
connecting through the API, COMPLETED TILs inserted directly, job rows."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import date
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from san_api.auth.tokens import mint
from san_common.crypto import TokenCipher
from san_common.jobs.registration import register_job_in_transaction
from san_common.jobs.types import JobType
from san_common.models import (
    AsyncJob,
    Category,
    DailySummary,
    GithubRepository,
    KnowledgeCard,
    Scrap,
    Tag,
    TilGithubCommit,
    User,
    card_tags,
)
from san_common.models.base import EMBEDDING_DIMENSIONS
from tests.conftest import JWT_SECRET
from tests.fakes.fake_github import FakeGithub

Sessions = async_sessionmaker[AsyncSession]
DAY = date(2026, 12, 2)
REDIRECT_URI = "http://app.test/github/oauth/callback"


@dataclass
class Person:
    subject: str
    headers: dict[str, str]
    token: str  # their GitHub token at the fake
    login: str
    user_id: uuid.UUID | None = None


@dataclass
class World:
    github: FakeGithub
    api: httpx.AsyncClient
    sessions: Sessions
    cipher: TokenCipher
    engine: AsyncEngine | None = None
    people: list[Person] = field(default_factory=list)

    def person(self, login: str | None = None) -> Person:
        token = self.github.add_user(login)
        subject = f"gh-{uuid.uuid4().hex}"
        person = Person(
            subject,
            {"Authorization": f"Bearer {mint(JWT_SECRET, subject)}"},
            token,
            self.github.login_of(token),
        )
        self.people.append(person)
        return person

    async def user_id(self, person: Person) -> uuid.UUID:
        if person.user_id is None:
            async with self.sessions() as session:
                person.user_id = await session.scalar(
                    select(User.id).where(User.external_id == person.subject)
                )
            assert person.user_id is not None, "the user has not called the API yet"
        return person.user_id

    async def link(self, person: Person) -> dict[str, Any]:
        response = await self.api.put(
            "/me/github", json={"accessToken": person.token}, headers=person.headers
        )
        assert response.status_code == 200, response.text
        await self.user_id(person)
        body: dict[str, Any] = response.json()
        return body

    async def connect(self, person: Person, name: str = "til", **fields: str) -> dict[str, Any]:
        response = await self.api.post(
            "/me/github/repositories",
            json={"owner": person.login, "name": name, **fields},
            headers=person.headers,
        )
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    async def ready(self, *, repo: str = "til", **fields: str) -> Person:
        """A linked person with one connected repository of their own."""
        person = self.person()
        self.github.add_repo(
            person.login, repo, branches=tuple(filter(None, [fields.get("branch")]))
        )
        await self.link(person)
        await self.connect(person, repo, **fields)
        return person

    async def authorize(self, person: Person) -> tuple[str, str]:
        """Start the OAuth flow and let the fake GitHub's 'browser' consent: (code, state)."""
        started = await self.api.get("/me/github/oauth/authorize", headers=person.headers)
        assert started.status_code == 200, started.text
        url = started.json()["authorizeUrl"]
        query = parse_qs(urlsplit(url).query)
        assert query["code_challenge_method"] == ["S256"] and query["code_challenge"]
        assert query["redirect_uri"] == [REDIRECT_URI]
        self.github.authorize_as(person.token)
        async with httpx.AsyncClient() as browser:
            consent = await browser.get(url)
        assert consent.status_code == 302
        back = parse_qs(urlsplit(consent.headers["location"]).query)
        assert back["state"] == query["state"]
        return back["code"][0], back["state"][0]

    async def callback(self, **params: str) -> httpx.Response:
        """GitHub's redirect, as a browser with no SAN credential follows it."""
        return await self.api.get("/github/oauth/callback", params=params)

    async def complete(self, person: Person, *, code: str, state: str) -> httpx.Response:
        """The signed-in client finishing the flow with the person's own bearer token."""
        return await self.api.post(
            "/me/github/oauth/complete",
            json={"code": code, "state": state},
            headers=person.headers,
        )

    async def til(
        self,
        person: Person,
        *,
        day: date = DAY,
        markdown: str | None = None,
        status: str = "COMPLETED",
    ) -> uuid.UUID:
        """A TIL row as TIL_GENERATION leaves it (inserted directly)."""
        user_id = await self.user_id(person)
        async with self.sessions() as session, session.begin():
            summary = DailySummary(
                user_id=user_id,
                target_date=day,
                status=status,
                title=f"TIL {day}",
                til_markdown=(
                    markdown or f"# TIL {day}\n\nLearned about {uuid.uuid4().hex}.\n"
                    if status == "COMPLETED"
                    else None
                ),
            )
            session.add(summary)
        return summary.id

    async def commit(self, person: Person, summary_id: uuid.UUID) -> httpx.Response:
        return await self.api.post(f"/til/{summary_id}/github-commits", headers=person.headers)

    async def register_directly(
        self, person: Person, summary_id: uuid.UUID, file_path: str
    ) -> tuple[uuid.UUID, uuid.UUID]:
        """(commit id, job id) of a commit registered as the API does, minus its checks —
        for worker tests that change GitHub between registration and processing."""
        user_id = await self.user_id(person)
        async with self.sessions() as session, session.begin():
            repo = (
                await session.scalars(
                    select(GithubRepository).where(GithubRepository.user_id == user_id)
                )
            ).one()
            summary = await session.get(DailySummary, summary_id)
            assert summary is not None and summary.til_markdown
            commit = TilGithubCommit(
                user_id=user_id,
                summary_id=summary_id,
                repository_id=repo.id,
                repo_owner=repo.owner,
                repo_name=repo.name,
                branch=repo.branch,
                file_path=file_path,
                content=summary.til_markdown,
                content_hash=hashlib.sha256(summary.til_markdown.encode()).hexdigest(),
            )
            session.add(commit)
            await session.flush()
            job = await register_job_in_transaction(
                session, job_type=JobType.TIL_GITHUB_COMMIT, target_id=commit.id, user_id=user_id
            )
        return commit.id, job.job_id

    async def card(self, person: Person, category: str, tags: list[str]) -> None:
        """A knowledge card as CARD_ANALYSIS leaves it (inserted directly)."""
        user_id = await self.user_id(person)
        content = f"{category} {' '.join(tags)} {uuid.uuid4().hex}"
        async with self.sessions() as session, session.begin():
            scrap = Scrap(
                user_id=user_id,
                content=content,
                content_hash=hashlib.sha256(content.encode()).hexdigest(),
            )
            group = Category(user_id=user_id, name=category)
            session.add_all([scrap, group])
            await session.flush()
            card = KnowledgeCard(
                user_id=user_id,
                scrap_id=scrap.id,
                category_id=group.id,
                title=content,
                summary=content,
                embedding=[1.0] + [0.0] * (EMBEDDING_DIMENSIONS - 1),
            )
            labels = [Tag(user_id=user_id, name=name) for name in tags]
            session.add_all([card, *labels])
            await session.flush()
            await session.execute(
                insert(card_tags).values([{"card_id": card.id, "tag_id": t.id} for t in labels])
            )

    async def job(self, job_id: uuid.UUID | str) -> AsyncJob:
        async with self.sessions() as session:
            job = await session.get(AsyncJob, uuid.UUID(str(job_id)))
        assert job is not None
        return job

    async def commit_row(self, commit_id: uuid.UUID | str) -> TilGithubCommit:
        async with self.sessions() as session:
            row = await session.get(TilGithubCommit, uuid.UUID(str(commit_id)))
        assert row is not None
        return row
