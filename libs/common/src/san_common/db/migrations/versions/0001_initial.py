"""Initial schema: users, scraps, cards, categories, tags, async_jobs, outbox.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql as pg

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JOB_TYPES = (
    "CARD_ANALYSIS",
    "SCRAP_REFINE",
    "TIL_GENERATION",
    "TIL_GITHUB_COMMIT",
    "RECALL_QUIZ_GENERATION",
    "GITHUB_STAR_RECOMMENDATION",
)
STATUSES = ("PENDING", "PROCESSING", "COMPLETED", "FAILED")


def _uuid_pk(name: str = "id") -> sa.Column:
    return sa.Column(name, pg.UUID(), primary_key=True, server_default=sa.text("gen_random_uuid()"))


def _ts(name: str, nullable: bool = False) -> sa.Column:
    default = None if nullable else sa.func.now()
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, server_default=default)


def _user_fk() -> sa.Column:
    return sa.Column(
        "user_id",
        pg.UUID(),
        sa.ForeignKey("users.id", ondelete="CASCADE", name=None),
        nullable=False,
    )


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")

    op.create_table(
        "users",
        _uuid_pk(),
        sa.Column("external_id", sa.Text(), nullable=False, unique=True),
        sa.Column("timezone", sa.Text(), nullable=False, server_default="UTC"),
        _ts("created_at"),
    )
    op.create_table(
        "scraps",
        _uuid_pk(),
        _user_fk(),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.CHAR(64), nullable=False),
        sa.Column("refined_content", sa.Text()),
        _ts("refined_at", nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.UniqueConstraint("user_id", "content_hash"),
    )
    for table in ("categories", "tags"):
        op.create_table(
            table,
            _uuid_pk(),
            _user_fk(),
            sa.Column("name", sa.Text(), nullable=False),
            _ts("created_at"),
            sa.UniqueConstraint("user_id", "name"),
        )
    op.create_table(
        "knowledge_cards",
        _uuid_pk(),
        _user_fk(),
        sa.Column(
            "scrap_id",
            pg.UUID(),
            sa.ForeignKey("scraps.id", ondelete="CASCADE"),
            nullable=False,
            unique=True,
        ),
        sa.Column("category_id", pg.UUID(), sa.ForeignKey("categories.id", ondelete="SET NULL")),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("embedding", Vector(1536), nullable=False),
        _ts("created_at"),
    )
    op.create_index(
        "ix_knowledge_cards_embedding_hnsw",
        "knowledge_cards",
        ["embedding"],
        postgresql_using="hnsw",
        postgresql_ops={"embedding": "vector_cosine_ops"},
    )
    op.create_index(
        "ix_knowledge_cards_user_id_created_at", "knowledge_cards", ["user_id", "created_at"]
    )
    op.create_table(
        "knowledge_card_tags",
        sa.Column(
            "card_id",
            pg.UUID(),
            sa.ForeignKey("knowledge_cards.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "tag_id", pg.UUID(), sa.ForeignKey("tags.id", ondelete="CASCADE"), primary_key=True
        ),
    )

    op.create_table(
        "async_jobs",
        sa.Column("job_id", pg.UUID(), primary_key=True),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("target_id", pg.UUID(), nullable=False),
        sa.Column("user_id", pg.UUID(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False, server_default="PENDING"),
        sa.Column("error_message", sa.Text()),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"),
        _ts("created_at"),
        _ts("updated_at"),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.Column("worker_id", sa.Text()),
        _ts("lease_expires_at", nullable=True),
        sa.CheckConstraint(
            "job_type IN (" + ", ".join(f"'{t}'" for t in JOB_TYPES) + ")", name="job_type"
        ),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")", name="status"
        ),
    )
    # docs/reference/job-rules.md §2.2: the database, not the application, forbids duplicate active
    # jobs.
    op.execute(
        "CREATE UNIQUE INDEX uk_async_jobs_active_target_job_type "
        "ON async_jobs (target_id, job_type) WHERE status IN ('PENDING', 'PROCESSING')"
    )
    op.create_index("ix_async_jobs_status_updated_at", "async_jobs", ["status", "updated_at"])
    op.create_index(
        "ix_async_jobs_target_id_job_type_created_at",
        "async_jobs",
        ["target_id", "job_type", "created_at"],
    )
    op.create_index(
        "ix_async_jobs_user_id_job_type_status", "async_jobs", ["user_id", "job_type", "status"]
    )

    op.create_table(
        "outbox_messages",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("message_id", pg.UUID(), nullable=False, unique=True),
        sa.Column("exchange", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=False),
        sa.Column("body", pg.JSONB(), nullable=False),
        sa.Column("headers", pg.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        _ts("created_at"),
        _ts("published_at", nullable=True),
    )
    op.create_index(
        "ix_outbox_messages_unpublished",
        "outbox_messages",
        ["id"],
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_index(
        "ix_outbox_messages_published_at",
        "outbox_messages",
        ["published_at"],
        postgresql_where=sa.text("published_at IS NOT NULL"),
    )
    # Wakes relays the moment a transaction that added outbox rows commits
    # (NOTIFY is delivered at commit); one notification per statement, not per row.
    op.execute(
        """
        CREATE FUNCTION san_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('san_outbox', '');
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER outbox_messages_notify AFTER INSERT ON outbox_messages "
        "FOR EACH STATEMENT EXECUTE FUNCTION san_outbox_notify()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS outbox_messages_notify ON outbox_messages")
    op.execute("DROP FUNCTION IF EXISTS san_outbox_notify()")
    for table in (
        "outbox_messages",
        "async_jobs",
        "knowledge_card_tags",
        "knowledge_cards",
        "tags",
        "categories",
        "scraps",
        "users",
    ):
        op.drop_table(table)
