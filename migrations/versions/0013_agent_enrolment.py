"""agent enrolment: enrolment tokens (scope enrol, a node-name pattern) and the node tokens they were exchanged for

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCOPES = ("agent", "scheduler", "operator", "admin")
_NEW_SCOPES = (*_SCOPES, "enrol")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("node_pattern", sa.Text(), nullable=True))
    op.drop_constraint(op.f("ck_api_tokens_scope"), "api_tokens", type_="check")
    op.create_check_constraint(op.f("ck_api_tokens_scope"), "api_tokens", _in("scope", _NEW_SCOPES))
    op.create_table(
        "agent_enrolments",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("node_name", sa.Text(), nullable=False),
        sa.Column("enrolment_token_id", sa.BigInteger(), nullable=False),
        sa.Column("agent_token_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["enrolment_token_id"],
            ["api_tokens.id"],
            name=op.f("fk_agent_enrolments_enrolment_token_id_api_tokens"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["agent_token_id"],
            ["api_tokens.id"],
            name=op.f("fk_agent_enrolments_agent_token_id_api_tokens"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_enrolments")),
        sa.UniqueConstraint("agent_token_id", name=op.f("uq_agent_enrolments_agent_token_id")),
    )
    op.create_index(op.f("ix_agent_enrolments_node_name"), "agent_enrolments", ["node_name"])
    op.create_index(op.f("ix_agent_enrolments_enrolment_token_id"), "agent_enrolments", ["enrolment_token_id"])


def downgrade() -> None:
    op.drop_table("agent_enrolments")
    op.execute("DELETE FROM api_tokens WHERE scope = 'enrol'")
    op.drop_constraint(op.f("ck_api_tokens_scope"), "api_tokens", type_="check")
    op.create_check_constraint(op.f("ck_api_tokens_scope"), "api_tokens", _in("scope", _SCOPES))
    op.drop_column("api_tokens", "node_pattern")
