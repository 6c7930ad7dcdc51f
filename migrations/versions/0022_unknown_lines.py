"""unknown lines: error-looking log lines no rule knows, counted per form (the line with its variable parts
masked) and per source, node, job and hour at ingest, so a new driver's or library's message is noticed

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "unknown_line_forms",
        sa.Column("form_id", sa.Text(), nullable=False),
        sa.Column("form", sa.Text(), nullable=False),
        sa.Column("example", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("form_id", name=op.f("pk_unknown_line_forms")),
    )
    op.create_table(
        "unknown_line_counts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("form_id", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("lines", sa.BigInteger(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_unknown_line_counts")),
    )
    # The ingest upsert's key (a line of no job under job 0) and, by hour first, the index of every window read.
    op.create_index(
        "uq_unknown_line_counts_key",
        "unknown_line_counts",
        ["hour", "form_id", "source", "node_id", sa.text("COALESCE(job_id, 0)")],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("uq_unknown_line_counts_key", table_name="unknown_line_counts")
    op.drop_table("unknown_line_counts")
    op.drop_table("unknown_line_forms")
