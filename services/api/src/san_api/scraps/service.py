"""Saving a scrap (docs/reference/job-rules.md §3.1): normalize, dedup per user, register the AI
jobs."""

from __future__ import annotations

import hashlib
import unicodedata
import uuid
from dataclasses import dataclass

import asyncpg

from san_api.errors import ContentTooLarge, ValidationFailed
from san_api.scraps import repository
from san_common.jobs.publishing import DirectRows
from san_common.jobs.registration import DuplicateActiveJob, register_job_on_connection
from san_common.jobs.types import JobType


@dataclass(frozen=True)
class SavedScrap:
    scrap_id: uuid.UUID
    analysis_job_id: uuid.UUID | None
    refine_job_id: uuid.UUID | None
    duplicate: bool


def normalize(content: str) -> str:
    return content.replace("\r\n", "\n").replace("\r", "\n").strip()


# Letters that render as nothing although Unicode does not class them as space or format:
# the Hangul fillers, the halfwidth Hangul filler and the blank Braille pattern.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def has_visible_text(content: str) -> bool:
    """Anything left once whitespace, controls and zero-width/format characters (ZWSP,
    ZWJ, BOM, bidi marks, soft hyphen, …: category Cf) are removed."""
    return any(
        not (c.isspace() or unicodedata.category(c) in ("Cf", "Cc") or c in _BLANK_LETTERS)
        for c in content
    )


def content_hash(normalized: str) -> str:
    return hashlib.sha256(normalized.encode("utf-8")).hexdigest()


async def save_scrap(
    connection: asyncpg.Connection,
    user_id: uuid.UUID,
    raw_content: str,
    *,
    max_bytes: int,
    direct: DirectRows | None = None,
) -> SavedScrap:
    """`direct`: where the jobs the caller publishes itself after its commit go (see
    `register_job_on_connection`)."""
    content = normalize(raw_content)
    if not content:
        raise ValidationFailed("content must not be empty or only whitespace")
    if not has_visible_text(content):
        raise ValidationFailed(
            "content must contain visible text, not only whitespace and zero-width or"
            " format characters"
        )
    try:
        size = len(content.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a JSON "\\ud800" escape
        raise ValidationFailed("content must be valid Unicode text (no lone surrogates)") from None
    if size > max_bytes:
        raise ContentTooLarge(f"content is {size} bytes; the limit is {max_bytes} bytes")
    if "\x00" in content:
        raise ValidationFailed("content must not contain NUL characters")

    digest = content_hash(content)
    scrap_id = await repository.insert_if_absent(connection, user_id, content, digest)
    if scrap_id is not None:
        analysis = await register_job_on_connection(
            connection,
            job_type=JobType.CARD_ANALYSIS,
            target_id=scrap_id,
            user_id=user_id,
            direct=direct,
        )
        refine = await register_job_on_connection(
            connection,
            job_type=JobType.SCRAP_REFINE,
            target_id=scrap_id,
            user_id=user_id,
            direct=direct,
        )
        return SavedScrap(scrap_id, analysis.job_id, refine.job_id, duplicate=False)

    existing = await repository.find_by_hash(connection, user_id, digest)
    assert existing is not None  # the conflicting row is committed: ON CONFLICT waited for it
    analysis_job_id = None
    if not await repository.has_card(connection, existing):
        try:
            registered = await register_job_on_connection(
                connection,
                job_type=JobType.CARD_ANALYSIS,
                target_id=existing,
                user_id=user_id,
                direct=direct,
            )
            analysis_job_id = registered.job_id
        except DuplicateActiveJob:
            # An analysis is on its way: the client polls that one. Read in this
            # transaction, after the conflict waited for the active job's commit.
            analysis_job_id = await repository.active_job(
                connection, existing, JobType.CARD_ANALYSIS
            )
    return SavedScrap(existing, analysis_job_id, None, duplicate=True)
