"""node returns: `returned` becomes `returning` (back in service, its return gate running), every node event names
its source, and a node running work before its gate is marked

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATES = ("healthy", "suspect", "cordoned", "evicted", "in_repair", "returning")
_OLD_STATES = ("healthy", "suspect", "cordoned", "evicted", "in_repair", "returned")
_SOURCES = ("diagnosis", "decision_ack", "scheduler", "placement", "person", "checks")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.drop_constraint(op.f("ck_nodes_state"), "nodes", type_="check")
    # A node `returned` passed its return already (a person's, or its checks'): it is healthy in the new machine.
    op.execute("UPDATE nodes SET state = 'healthy' WHERE state = 'returned'")
    op.create_check_constraint(op.f("ck_nodes_state"), "nodes", _in("state", _STATES))
    op.add_column("nodes", sa.Column("work_before_gate_at", sa.DateTime(timezone=True), nullable=True))

    op.add_column("node_events", sa.Column("source", sa.Text(), nullable=True))
    # The history written so far named its actor only; its source follows from the actor and the kind.
    op.execute(
        """
        UPDATE node_events SET source = CASE
            WHEN actor = 'faultline checks' THEN 'checks'
            WHEN kind IN ('suspect', 'cleared', 'lemon') THEN 'diagnosis'
            WHEN decision_id IS NOT NULL THEN 'decision_ack'
            ELSE 'person' END
        """
    )
    op.alter_column("node_events", "source", nullable=False)
    op.create_check_constraint(op.f("ck_node_events_source"), "node_events", _in("source", _SOURCES))


def downgrade() -> None:
    op.drop_constraint(op.f("ck_node_events_source"), "node_events", type_="check")
    op.drop_column("node_events", "source")
    op.drop_column("nodes", "work_before_gate_at")
    op.drop_constraint(op.f("ck_nodes_state"), "nodes", type_="check")
    # The older machine's nearest state: back in service, not yet checked.
    op.execute("UPDATE nodes SET state = 'returned' WHERE state = 'returning'")
    op.create_check_constraint(op.f("ck_nodes_state"), "nodes", _in("state", _OLD_STATES))
