"""escalation ladder: a node marked for vendor replacement (RMA), when and why (the ladder's top rung, set when the
scheduler carries out its eviction); the rungs themselves are recorded on the decisions' evidence

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-29 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("rma_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("nodes", sa.Column("rma_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "rma_reason")
    op.drop_column("nodes", "rma_at")
