"""incident acknowledgements: an on-call says "I'm on it" (who, when), kept on the incident without changing its
state or decisions

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 18:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The latest acknowledgement as columns (the lists show it without reading the history), and every one of them,
    # oldest first, as the incident's record of who took it.
    op.add_column("incidents", sa.Column("acknowledged_by", sa.Text(), nullable=True))
    op.add_column("incidents", sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "incidents",
        sa.Column("acknowledgements", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("incidents", "acknowledgements")
    op.drop_column("incidents", "acknowledged_at")
    op.drop_column("incidents", "acknowledged_by")
