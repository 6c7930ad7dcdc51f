"""evidence bundles: the evidence_bundles table (a node's tar.gz per evict/diagnose/RMA decision, in PostgreSQL) and
the `bundle` directive kind that asks the node's agent for one

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-29 00:30:00
"""

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# The directive kinds are widened from what the database holds (other revisions of this wave widen the same check),
# so this one adds `bundle` without dropping theirs, and its downgrade removes only its own.
def _kinds() -> list[str]:
    definition = op.get_bind().scalar(
        sa.text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'ck_directives_kind'")
    )
    return re.findall(r"'([^']+)'", definition or "")


def _set_kinds(kinds: list[str]) -> None:
    op.drop_constraint(op.f("ck_directives_kind"), "directives", type_="check")
    listed = ", ".join(f"'{k}'" for k in kinds)
    op.create_check_constraint(op.f("ck_directives_kind"), "directives", f"kind IN ({listed})")


def upgrade() -> None:
    op.create_table(
        "evidence_bundles",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("decision_id", sa.BigInteger(), nullable=False),
        sa.Column("incident_id", sa.BigInteger(), nullable=True),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stored_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("sha256", sa.Text(), nullable=True),
        sa.Column("manifest", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("content", sa.LargeBinary(), nullable=True),
        sa.CheckConstraint("state IN ('requested', 'stored')", name=op.f("ck_evidence_bundles_state")),
        sa.CheckConstraint("(state = 'stored') = (content IS NOT NULL)", name=op.f("ck_evidence_bundles_content")),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name=op.f("fk_evidence_bundles_decision_id_decisions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_evidence_bundles_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_evidence_bundles_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evidence_bundles")),
    )
    op.create_index("uq_evidence_bundles_decision_id", "evidence_bundles", ["decision_id"], unique=True)
    op.create_index("ix_evidence_bundles_incident_id", "evidence_bundles", ["incident_id"])
    op.create_index("ix_evidence_bundles_node_id_requested_at", "evidence_bundles", ["node_id", "requested_at"])
    op.create_index("ix_evidence_bundles_requested_at", "evidence_bundles", ["requested_at"])
    if "bundle" not in (kinds := _kinds()):
        _set_kinds([*kinds, "bundle"])


def downgrade() -> None:
    op.execute("DELETE FROM directives WHERE kind = 'bundle'")
    _set_kinds([k for k in _kinds() if k != "bundle"])
    op.drop_table("evidence_bundles")
