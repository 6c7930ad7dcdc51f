"""diagnosis: why the service asked for stacks, and one decision per incident, kind and node

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("findings", sa.Column("blame", sa.Text(), server_default="unknown", nullable=False))
    op.add_column("findings", sa.Column("role", sa.Text(), server_default="cause", nullable=False))
    op.add_column("findings", sa.Column("action", sa.Text(), server_default="none", nullable=False))
    op.add_column("directives", sa.Column("purpose", sa.Text(), nullable=True))
    op.add_column("directives", sa.Column("round", sa.SmallInteger(), nullable=True))
    op.add_column("directives", sa.Column("campaign_id", sa.Uuid(), nullable=True))
    op.create_index(
        "uq_decisions_incident_kind_node",
        "decisions",
        ["incident_id", "kind", sa.text("coalesce(node_id, 0)")],
        unique=True,
    )
    op.create_index("ix_decisions_node_id_created_at", "decisions", ["node_id", "created_at"])
    op.create_index("ix_decisions_job_id_created_at", "decisions", ["job_id", "created_at"])
    op.create_index("ix_stack_dumps_directive_id", "stack_dumps", ["directive_id"])


def downgrade() -> None:
    op.drop_index("ix_stack_dumps_directive_id", table_name="stack_dumps")
    op.drop_index("ix_decisions_job_id_created_at", table_name="decisions")
    op.drop_index("ix_decisions_node_id_created_at", table_name="decisions")
    op.drop_index("uq_decisions_incident_kind_node", table_name="decisions")
    op.drop_column("directives", "campaign_id")
    op.drop_column("directives", "round")
    op.drop_column("directives", "purpose")
    op.drop_column("findings", "action")
    op.drop_column("findings", "role")
    op.drop_column("findings", "blame")
