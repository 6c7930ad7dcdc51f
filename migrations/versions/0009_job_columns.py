"""job columns: the metric columns each job's agents report, so window rollups aggregate only those

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 01:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_columns",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_columns_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "source", "name", name="pk_job_columns"),
    )


def downgrade() -> None:
    op.drop_table("job_columns")
