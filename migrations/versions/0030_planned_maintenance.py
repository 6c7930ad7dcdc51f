"""planned maintenance: the maintenance_windows table, a `checkpoint` directive kind, a `maintenance` node event source

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-29 00:30:00
"""

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The two vocabularies are widened from what the database holds now (earlier revisions of this wave may widen the
# same checks), so this revision adds its value without dropping theirs, and its downgrade removes only its own.
_WIDENED = (("directives", "kind", "checkpoint"), ("node_events", "source", "maintenance"))


def _values(table: str, column: str) -> list[str]:
    definition = op.get_bind().scalar(
        sa.text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = :name"),
        {"name": f"ck_{table}_{column}"},
    )
    return re.findall(r"'([^']+)'", definition or "")


def _set_check(table: str, column: str, values: list[str]) -> None:
    op.drop_constraint(op.f(f"ck_{table}_{column}"), table, type_="check")
    listed = ", ".join(f"'{v}'" for v in values)
    op.create_check_constraint(op.f(f"ck_{table}_{column}"), table, f"{column} IN ({listed})")


def upgrade() -> None:
    op.create_table(
        "maintenance_windows",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=True),
        sa.Column("author", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelled_by", sa.Text(), nullable=True),
        sa.Column("prepared_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("silence_id", sa.BigInteger(), nullable=True),
        sa.Column("checkpoint_directive_id", sa.Text(), nullable=True),
        sa.Column("returned_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "source IN ('operator', 'cloud:aws', 'cloud:gcp', 'cloud:azure')",
            name=op.f("ck_maintenance_windows_source"),
        ),
        sa.CheckConstraint("ends_at > starts_at", name=op.f("ck_maintenance_windows_window")),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_maintenance_windows_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["silence_id"],
            ["silences.id"],
            name=op.f("fk_maintenance_windows_silence_id_silences"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_maintenance_windows")),
    )
    op.create_index("ix_maintenance_windows_node_id_starts_at", "maintenance_windows", ["node_id", "starts_at"])
    op.create_index(
        "ix_maintenance_windows_open",
        "maintenance_windows",
        ["ends_at"],
        postgresql_where=sa.text("returned_at IS NULL"),
    )
    op.create_index(
        "uq_maintenance_windows_node_id_source_external_id",
        "maintenance_windows",
        ["node_id", "source", "external_id"],
        unique=True,
        postgresql_where=sa.text("external_id IS NOT NULL"),
    )
    for table, column, value in _WIDENED:
        values = _values(table, column)
        if value not in values:
            _set_check(table, column, [*values, value])


def downgrade() -> None:
    op.execute("DELETE FROM directives WHERE kind = 'checkpoint'")
    op.execute("UPDATE node_events SET source = 'person' WHERE source = 'maintenance'")
    for table, column, value in _WIDENED:
        _set_check(table, column, [v for v in _values(table, column) if v != value])
    op.drop_table("maintenance_windows")
