"""incident lifecycle: a climbing counter updates one finding; who resolved an incident by hand

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 23:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # An ongoing claim (a counter still climbing) is one row, updated pass after pass: its series and when it
    # was last seen (observed_at stays the first time).
    op.add_column("findings", sa.Column("series_key", sa.Text(), nullable=True))
    op.add_column("findings", sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_findings_job_id_series_key",
        "findings",
        ["job_id", "series_key"],
        postgresql_where="series_key IS NOT NULL",
    )
    # The person who resolved an incident by hand (resolution says why, resolved_at when).
    op.add_column("incidents", sa.Column("resolved_by", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("incidents", "resolved_by")
    op.drop_index("ix_findings_job_id_series_key", table_name="findings")
    op.drop_column("findings", "last_seen_at")
    op.drop_column("findings", "series_key")
