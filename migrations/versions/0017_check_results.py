"""check results: stop-time check results shipped by the agents, with the service's verdict; run_checks
directives, addressed to one node

Revision ID: 0017
Revises: 0013
Create Date: 2026-11-26 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = "('pass', 'fail', 'not_available', 'refused')"
_KINDS = "kind IN ('dump_stacks')"
_NEW_KINDS = "kind IN ('dump_stacks', 'run_checks')"


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

    op.add_column("directives", sa.Column("node_id", sa.BigInteger(), nullable=True))
    op.add_column("directives", sa.Column("params", postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.create_foreign_key(
        op.f("fk_directives_node_id_nodes"), "directives", "nodes", ["node_id"], ["id"], ondelete="CASCADE"
    )
    op.alter_column("directives", "job_id", existing_type=sa.BigInteger(), nullable=True)
    op.drop_constraint(op.f("ck_directives_kind"), "directives", type_="check")
    op.create_check_constraint(op.f("ck_directives_kind"), "directives", _NEW_KINDS)
    op.create_check_constraint(op.f("ck_directives_target"), "directives", "(job_id IS NULL) <> (node_id IS NULL)")
    op.create_index("ix_directives_node_id", "directives", ["node_id"], postgresql_where=sa.text("node_id IS NOT NULL"))


def downgrade() -> None:
    op.execute("DELETE FROM directives WHERE node_id IS NOT NULL")
    op.drop_index("ix_directives_node_id", table_name="directives")
    op.drop_constraint(op.f("ck_directives_target"), "directives", type_="check")
    op.drop_constraint(op.f("ck_directives_kind"), "directives", type_="check")
    op.create_check_constraint(op.f("ck_directives_kind"), "directives", _KINDS)
    op.alter_column("directives", "job_id", existing_type=sa.BigInteger(), nullable=False)
    op.drop_constraint(op.f("fk_directives_node_id_nodes"), "directives", type_="foreignkey")
    op.drop_column("directives", "params")
    op.drop_column("directives", "node_id")
    op.drop_table("check_results")
