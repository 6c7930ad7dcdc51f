"""act: decision lifecycle for schedulers, node lifecycle, silences, webhook outbox, Alertmanager alerts

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 18:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KINDS = ("evict", "restart", "rollback", "diagnose", "none")
_NEW_KINDS = (*_KINDS, "cordon", "return")
_STATES = ("pending", "sent", "failed")
_NEW_STATES = ("pending", "sending", "sent", "failed")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_table(
        "silences",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("node_pattern", sa.Text(), nullable=True),
        sa.Column("job_pattern", sa.Text(), nullable=True),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("author", sa.Text(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("expired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("node_pattern IS NOT NULL OR job_pattern IS NOT NULL", name=op.f("ck_silences_matcher")),
        sa.CheckConstraint("ends_at > starts_at", name=op.f("ck_silences_window")),
        sa.PrimaryKeyConstraint("id", name="pk_silences"),
    )
    op.create_index("ix_silences_ends_at", "silences", ["ends_at"])

    op.alter_column("decisions", "incident_id", nullable=True)
    op.alter_column("decisions", "job_id", nullable=True)
    op.drop_constraint(op.f("ck_decisions_kind"), "decisions", type_="check")
    op.create_check_constraint(op.f("ck_decisions_kind"), "decisions", _in("kind", _NEW_KINDS))
    op.create_index(
        "ix_decisions_expires_at_pending", "decisions", ["expires_at"], postgresql_where="state = 'pending'"
    )
    # Long-polling schedulers wake on this channel as soon as a decision is written or changes state,
    # whichever process wrote it.
    op.execute(
        """
        CREATE FUNCTION faultline_notify_decision() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('faultline_decisions', NEW.id::text);
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER decisions_notify AFTER INSERT OR UPDATE OF state ON decisions "
        "FOR EACH ROW EXECUTE FUNCTION faultline_notify_decision()"
    )

    op.add_column(
        "incidents",
        sa.Column(
            "silence_id",
            sa.BigInteger(),
            sa.ForeignKey("silences.id", ondelete="SET NULL", name="fk_incidents_silence_id_silences"),
            nullable=True,
        ),
    )

    op.add_column("incidents", sa.Column("resolution", sa.Text(), nullable=True))
    op.add_column("nodes", sa.Column("state_reason", sa.Text(), nullable=True))
    op.add_column("nodes", sa.Column("lemon", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("nodes", sa.Column("quarantined_until", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_nodes_state", "nodes", ["state"])
    op.add_column("node_events", sa.Column("details", postgresql.JSONB(), nullable=True))

    op.add_column("notification_channels", sa.Column("group_wait_s", sa.Float(), server_default="5", nullable=False))
    op.add_column(
        "notification_channels", sa.Column("rate_limit_per_minute", sa.Integer(), server_default="10", nullable=False)
    )
    op.add_column("notification_channels", sa.Column("author", sa.Text(), nullable=True))
    op.add_column("notification_deliveries", sa.Column("event", sa.Text(), server_default="opened", nullable=False))
    op.add_column("notification_deliveries", sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("notification_deliveries", sa.Column("message_key", sa.Text(), nullable=True))
    op.drop_constraint(op.f("ck_notification_deliveries_state"), "notification_deliveries", type_="check")
    op.create_check_constraint(
        op.f("ck_notification_deliveries_state"), "notification_deliveries", _in("state", _NEW_STATES)
    )

    op.create_index(
        "uq_log_events_alert",
        "log_events",
        [sa.text("(fields ->> 'fingerprint')"), "ts"],
        unique=True,
        postgresql_where="source = 'alertmanager'",
    )


def downgrade() -> None:
    op.drop_index("uq_log_events_alert", table_name="log_events")
    op.execute("DELETE FROM notification_deliveries WHERE state = 'sending'")
    op.drop_constraint(op.f("ck_notification_deliveries_state"), "notification_deliveries", type_="check")
    op.create_check_constraint(
        op.f("ck_notification_deliveries_state"), "notification_deliveries", _in("state", _STATES)
    )
    op.drop_column("notification_deliveries", "message_key")
    op.drop_column("notification_deliveries", "claimed_at")
    op.drop_column("notification_deliveries", "event")
    op.drop_column("notification_channels", "author")
    op.drop_column("notification_channels", "rate_limit_per_minute")
    op.drop_column("notification_channels", "group_wait_s")
    op.drop_column("node_events", "details")
    op.drop_index("ix_nodes_state", table_name="nodes")
    op.drop_column("nodes", "quarantined_until")
    op.drop_column("nodes", "lemon")
    op.drop_column("nodes", "state_reason")
    op.drop_column("incidents", "silence_id")
    op.drop_column("incidents", "resolution")
    op.execute("DROP TRIGGER decisions_notify ON decisions")
    op.execute("DROP FUNCTION faultline_notify_decision()")
    op.drop_index("ix_decisions_expires_at_pending", table_name="decisions")
    op.execute("DELETE FROM decisions WHERE kind IN ('cordon', 'return') OR incident_id IS NULL OR job_id IS NULL")
    op.drop_constraint(op.f("ck_decisions_kind"), "decisions", type_="check")
    op.create_check_constraint(op.f("ck_decisions_kind"), "decisions", _in("kind", _KINDS))
    op.alter_column("decisions", "job_id", nullable=False)
    op.alter_column("decisions", "incident_id", nullable=False)
    op.drop_table("silences")
