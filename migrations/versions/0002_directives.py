"""directives: stack-dump requests that ingest answers deliver to agents

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 15:01:36.447898
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "directives",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("requested_by", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("kind IN ('dump_stacks')", name=op.f("ck_directives_kind")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_directives_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_directives")),
    )
    op.create_index("ix_directives_expires_at", "directives", ["expires_at"], unique=False)
    op.create_index("ix_directives_job_id", "directives", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_directives_job_id", table_name="directives")
    op.drop_index("ix_directives_expires_at", table_name="directives")
    op.drop_table("directives")
