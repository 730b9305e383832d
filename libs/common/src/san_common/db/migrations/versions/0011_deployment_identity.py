"""the deployment's identity: one row, made here

Revision ID: 0011_deployment_identity
Revises: 0010_job_transitions

Every message the relay publishes carries this id, and a worker dead-letters a message
that carries another (docs/architecture.md, "Deployment identity"). Made by the migration
so that every process of a deployment reads the same id from its database, and a second
deployment (its own database) gets its own.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_deployment_identity"
down_revision = "0010_job_transitions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployment",
        sa.Column("one", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column(
            "deployment_id", sa.Uuid(), server_default=sa.text("gen_random_uuid()"), nullable=False
        ),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("one", name=op.f("ck_deployment_one_row")),
        sa.PrimaryKeyConstraint("one", name=op.f("pk_deployment")),
    )
    op.execute("INSERT INTO deployment DEFAULT VALUES")


def downgrade() -> None:
    op.drop_table("deployment")
