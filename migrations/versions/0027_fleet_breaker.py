"""fleet breaker: the fleet circuit breaker's one row (closed or tripped, when and why it tripped, who reset it) and
its audit trail of trips and resets

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-29 00:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fleet_breaker",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("state", sa.Text(), server_default="closed", nullable=False),
        sa.Column("tripped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("tripped_reason", sa.Text(), nullable=True),
        sa.Column("out_nodes", sa.Integer(), nullable=True),
        sa.Column("fleet_nodes", sa.Integer(), nullable=True),
        sa.Column("limit_nodes", sa.Integer(), nullable=True),
        sa.Column("reset_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reset_by", sa.Text(), nullable=True),
        sa.Column("reset_reason", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_fleet_breaker_one_row")),
        sa.CheckConstraint("state IN ('closed', 'tripped')", name=op.f("ck_fleet_breaker_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_breaker")),
    )
    op.execute("INSERT INTO fleet_breaker (id, state) VALUES (1, 'closed')")
    op.create_table(
        "breaker_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("details", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.CheckConstraint("kind IN ('tripped', 'reset')", name=op.f("ck_breaker_events_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_breaker_events")),
    )
    op.create_index("ix_breaker_events_at", "breaker_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_breaker_events_at", table_name="breaker_events")
    op.drop_table("breaker_events")
    op.drop_table("fleet_breaker")
