"""reset gpu: decisions of kind reset_gpu name one GPU of their node

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 04:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KINDS = ("evict", "restart", "rollback", "diagnose", "none", "cordon", "return")
_NEW_KINDS = (*_KINDS, "reset_gpu")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("gpu", sa.SmallInteger(), nullable=True))
    op.drop_constraint(op.f("ck_decisions_kind"), "decisions", type_="check")
    op.create_check_constraint(op.f("ck_decisions_kind"), "decisions", _in("kind", _NEW_KINDS))
    op.create_check_constraint(op.f("ck_decisions_gpu"), "decisions", "(kind = 'reset_gpu') = (gpu IS NOT NULL)")
    # The escalation check reads one GPU's recent resets.
    op.create_index(
        "ix_decisions_node_id_gpu_created_at",
        "decisions",
        ["node_id", "gpu", "created_at"],
        postgresql_where="kind = 'reset_gpu'",
    )


def downgrade() -> None:
    op.drop_index("ix_decisions_node_id_gpu_created_at", table_name="decisions")
    op.execute("DELETE FROM decisions WHERE kind = 'reset_gpu'")
    op.drop_constraint(op.f("ck_decisions_gpu"), "decisions", type_="check")
    op.drop_constraint(op.f("ck_decisions_kind"), "decisions", type_="check")
    op.create_check_constraint(op.f("ck_decisions_kind"), "decisions", _in("kind", _KINDS))
    op.drop_column("decisions", "gpu")
