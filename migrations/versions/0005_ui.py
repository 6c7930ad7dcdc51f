"""ui: web UI sessions (signed in with an operator token or vouched for by an authenticating proxy); findings by node

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column("token_id", sa.BigInteger(), nullable=True),
        sa.Column("user_name", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("csrf_token", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("scope IN ('agent', 'scheduler', 'operator', 'admin')", name=op.f("ck_ui_sessions_scope")),
        sa.ForeignKeyConstraint(
            ["token_id"], ["api_tokens.id"], name=op.f("fk_ui_sessions_token_id_api_tokens"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ui_sessions")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_ui_sessions_key_hash")),
    )
    op.create_index("ix_ui_sessions_expires_at", "ui_sessions", ["expires_at"])
    # A node's page lists the incidents whose findings name it; the cluster map reads the last minutes' findings.
    op.create_index("ix_findings_node_id", "findings", ["node_id"])
    op.create_index("ix_findings_created_at", "findings", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_findings_created_at", table_name="findings")
    op.drop_index("ix_findings_node_id", table_name="findings")
    op.drop_index("ix_ui_sessions_expires_at", table_name="ui_sessions")
    op.drop_table("ui_sessions")
