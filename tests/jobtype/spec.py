"""The test-only job type's spec and its target table (a word count of a text)."""

from __future__ import annotations

from sqlalchemy import (
    Column,
    ColumnElement,
    DateTime,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    exists,
    func,
    text,
)

from san_common.jobs import registry

WORD_COUNT = "SAN_TEST_WORD_COUNT"  # a production type would be a JobType value

METADATA = MetaData()
WORD_COUNTS = Table(
    "san_test_word_counts",
    METADATA,
    Column("id", Uuid, primary_key=True, server_default=text("gen_random_uuid()")),
    Column("user_id", Uuid, nullable=False),
    Column("text", Text, nullable=False),
    Column("words", Integer),
    Column("status", Text, nullable=False, server_default="PENDING"),
    Column("error_message", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)


def _counted(target_id: registry.TargetId) -> ColumnElement[bool]:
    return exists().where(WORD_COUNTS.c.id == target_id, WORD_COUNTS.c.words.is_not(None))


SPEC = registry.JobSpec(
    job_type=WORD_COUNT,
    consumer="tests",
    target=WORD_COUNTS,
    already_done=_counted,
    mirror=registry.Mirror(WORD_COUNTS),
    timeout_seconds=10,
)
