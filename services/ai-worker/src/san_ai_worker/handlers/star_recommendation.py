"""GITHUB_STAR_RECOMMENDATION: the user's GitHub stars + what they are learning → the AI's
picks, with reasons (docs/reference/job-rules.md §3.5). The job's target is the user.

Every star is read (`Link` pagination, 100 per page); the AI sees at most `MAX_STARS`
of them (the most recently starred, GitHub's order) so one prompt stays a sane size. The
results replace the user's previous recommendations when the job completes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from san_ai_worker import repository
from san_ai_worker.ai.provider import AiProvider
from san_ai_worker.ai.schemas import StarInput
from san_ai_worker.repository import NewStarRecommendation
from san_common.crypto import DecryptionFailed, Purpose, TokenCipher
from san_common.errors import PermanentJobError
from san_common.github import GithubClient, StarredRepo
from san_common.jobs.types import JobType
from san_common.models import AsyncJob
from san_common.worker import JobHandler, handles

MAX_STARS = 500


@dataclass(frozen=True)
class _Request:
    user_id: uuid.UUID
    encrypted_token: str
    interests: list[str]


@handles(JobType.GITHUB_STAR_RECOMMENDATION)
class StarRecommendationHandler(JobHandler[_Request, list[NewStarRecommendation]]):
    def __init__(self, ai: AiProvider, github: GithubClient, cipher: TokenCipher) -> None:
        self._ai = ai
        self._github = github
        self._cipher = cipher

    async def load(self, session: AsyncSession, job: AsyncJob) -> _Request:
        user_id = job.target_id
        encrypted = await repository.get_github_token(session, user_id)
        if encrypted is None:
            raise PermanentJobError("GitHub is not linked: link GitHub and ask again")
        return _Request(user_id, encrypted, await repository.user_interests(session, user_id))

    async def run(self, job: AsyncJob, request: _Request) -> list[NewStarRecommendation]:
        try:
            token = self._cipher.decrypt(
                request.encrypted_token, user_id=request.user_id, purpose=Purpose.GITHUB_TOKEN
            )
        except DecryptionFailed as exc:
            raise PermanentJobError(
                "the stored GitHub token cannot be decrypted: relink GitHub"
            ) from exc
        stars = await self._github.starred(token)
        if not stars:
            return []
        by_name = {star.full_name: star for star in stars}
        answer = await self._ai.recommend_stars(
            [_star_input(star) for star in stars[:MAX_STARS]], request.interests
        )
        kept: list[NewStarRecommendation] = []
        # Best first; `sorted` is stable, so the AI's own order breaks ties.
        for rec in sorted(answer.recommendations, key=lambda r: -r.score):
            star = by_name.get(rec.repoFullName)
            if star is None or any(k.repo_full_name == star.full_name for k in kept):
                continue  # not a star of this user (a model may invent names), or repeated
            kept.append(
                NewStarRecommendation(
                    repo_full_name=star.full_name,
                    html_url=star.html_url,
                    description=star.description,
                    reason=rec.reason,
                    score=rec.score,
                )
            )
        return kept

    async def store(
        self, session: AsyncSession, job: AsyncJob, recommendations: list[NewStarRecommendation]
    ) -> None:
        await repository.replace_star_recommendations(
            session, job.target_id, job.job_id, recommendations
        )


def _star_input(star: StarredRepo) -> StarInput:
    return StarInput(
        full_name=star.full_name,
        description=star.description,
        topics=list(star.topics),
        language=star.language,
        html_url=star.html_url,
    )
