"""check results: stop-time check results shipped by the agents, with the service's verdict

Revision ID: 0017
Revises: 0010
Create Date: 2026-11-26 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = "('pass', 'fail', 'not_available', 'refused')"


def upgrade() -> None:
    op.create_table(
        "check_results",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("directive_id", sa.Text(), nullable=True),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("check", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("gpu_model", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("verdict", sa.Text(), nullable=False),
        sa.Column("basis", sa.Text(), nullable=False),
        sa.Column("measured", sa.Float(), nullable=True),
        sa.Column("expected", sa.Float(), nullable=True),
        sa.Column("cutoff", sa.Float(), nullable=True),
        sa.Column("unit", sa.Text(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("finding_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(f"status IN {_STATUSES}", name=op.f("ck_check_results_status")),
        sa.CheckConstraint(f"verdict IN {_STATUSES}", name=op.f("ck_check_results_verdict")),
        sa.CheckConstraint("basis IN ('fleet', 'spec', 'agent')", name=op.f("ck_check_results_basis")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_check_results_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["finding_id"], ["findings.id"], name=op.f("fk_check_results_finding_id_findings"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_check_results")),
    )
    op.create_index("ix_check_results_node_id_ts", "check_results", ["node_id", "ts"])
    op.create_index(
        "ix_check_results_history",
        "check_results",
        ["check", "gpu_model", "ts"],
        postgresql_where=sa.text("verdict = 'pass' AND measured IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_table("check_results")
