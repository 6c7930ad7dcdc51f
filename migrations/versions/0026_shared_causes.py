"""shared causes: fleet incidents that blame one component (a leaf switch, a rack, a power domain, a driver, firmware
or kernel version, a storage mount, an NVLink domain) for findings on several nodes, and the cordons decided for it

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-29 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KINDS = ("switch", "rack", "power_domain", "driver", "firmware", "kernel", "storage", "nvlink_domain")
_STATES = ("open", "resolved")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_table(
        "shared_incidents",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("component_kind", sa.Text(), nullable=False),
        sa.Column("component", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default="open", nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("members", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False),
        sa.Column("evidence", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.CheckConstraint(_in("component_kind", _KINDS), name=op.f("ck_shared_incidents_component_kind")),
        sa.CheckConstraint(_in("state", _STATES), name=op.f("ck_shared_incidents_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shared_incidents")),
    )
    op.create_index(
        "uq_shared_incidents_open_component",
        "shared_incidents",
        ["component_kind", "component"],
        unique=True,
        postgresql_where=sa.text("state = 'open'"),
    )
    op.create_index("ix_shared_incidents_opened_at", "shared_incidents", ["opened_at"])
    op.add_column("decisions", sa.Column("shared_incident_id", sa.BigInteger(), nullable=True))
    op.create_foreign_key(
        op.f("fk_decisions_shared_incident_id_shared_incidents"),
        "decisions",
        "shared_incidents",
        ["shared_incident_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_index(
        "uq_decisions_shared_incident_kind_node",
        "decisions",
        ["shared_incident_id", "kind", "node_id"],
        unique=True,
        postgresql_where=sa.text("shared_incident_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_decisions_shared_incident_kind_node", table_name="decisions")
    op.drop_constraint(op.f("fk_decisions_shared_incident_id_shared_incidents"), "decisions", type_="foreignkey")
    op.drop_column("decisions", "shared_incident_id")
    op.drop_index("ix_shared_incidents_opened_at", table_name="shared_incidents")
    op.drop_index("uq_shared_incidents_open_component", table_name="shared_incidents")
    op.drop_table("shared_incidents")
