"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 13:24:26.664927
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("token_hash", sa.Text(), nullable=False),
        sa.Column("prefix", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("node_name", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("scope IN ('agent', 'scheduler', 'operator', 'admin')", name=op.f("ck_api_tokens_scope")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("external_id", sa.Text(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("tp", sa.Integer(), nullable=True),
        sa.Column("pp", sa.Integer(), nullable=True),
        sa.Column("dp", sa.Integer(), nullable=True),
        sa.Column("rank_order", sa.Text(), nullable=True),
        sa.Column("hang_timeout_s", sa.Integer(), server_default="600", nullable=False),
        sa.Column("state", sa.Text(), server_default="running", nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("source IN ('registered', 'agent')", name=op.f("ck_jobs_source")),
        sa.CheckConstraint("state IN ('running', 'finished', 'failed')", name=op.f("ck_jobs_state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("external_id", name=op.f("uq_jobs_external_id")),
    )
    op.create_table(
        "log_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("severity", sa.Text(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("line", sa.Text(), nullable=False),
        sa.Column("fields", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("signature", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_log_events")),
    )
    op.create_index("ix_log_events_job_id_ts", "log_events", ["job_id", "ts"], unique=False)
    op.create_index("ix_log_events_node_id_ts", "log_events", ["node_id", "ts"], unique=False)
    op.create_table(
        "metric_samples",
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("gpu", sa.SmallInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("gpu_util", sa.REAL(), nullable=True),
        sa.Column("mem_copy_util", sa.REAL(), nullable=True),
        sa.Column("enc_util", sa.REAL(), nullable=True),
        sa.Column("dec_util", sa.REAL(), nullable=True),
        sa.Column("sm_clock", sa.REAL(), nullable=True),
        sa.Column("mem_clock", sa.REAL(), nullable=True),
        sa.Column("gpu_temp", sa.REAL(), nullable=True),
        sa.Column("memory_temp", sa.REAL(), nullable=True),
        sa.Column("power_usage", sa.REAL(), nullable=True),
        sa.Column("power_limit", sa.REAL(), nullable=True),
        sa.Column("fb_free", sa.REAL(), nullable=True),
        sa.Column("fb_used", sa.REAL(), nullable=True),
        sa.Column("xid_last", sa.REAL(), nullable=True),
        sa.Column("clock_event_reasons", sa.Double(), nullable=True),
        sa.Column("gr_engine_active", sa.REAL(), nullable=True),
        sa.Column("sm_active", sa.REAL(), nullable=True),
        sa.Column("sm_occupancy", sa.REAL(), nullable=True),
        sa.Column("tensor_active", sa.REAL(), nullable=True),
        sa.Column("dram_active", sa.REAL(), nullable=True),
        sa.Column("total_energy", sa.Double(), nullable=True),
        sa.Column("pcie_replay", sa.Double(), nullable=True),
        sa.Column("power_violation", sa.Double(), nullable=True),
        sa.Column("thermal_violation", sa.Double(), nullable=True),
        sa.Column("ecc_sbe_volatile", sa.Double(), nullable=True),
        sa.Column("ecc_dbe_volatile", sa.Double(), nullable=True),
        sa.Column("remapped_rows_correctable", sa.Double(), nullable=True),
        sa.Column("remapped_rows_uncorrectable", sa.Double(), nullable=True),
        sa.Column("row_remap_failure", sa.REAL(), nullable=True),
        sa.Column("nvlink_bandwidth_total", sa.Double(), nullable=True),
        sa.Column("nvlink_crc_flit_errors", sa.Double(), nullable=True),
        sa.Column("nvlink_crc_data_errors", sa.Double(), nullable=True),
        sa.Column("nvlink_replay_errors", sa.Double(), nullable=True),
        sa.Column("nvlink_recovery_errors", sa.Double(), nullable=True),
        sa.Column("pcie_tx_bytes", sa.Double(), nullable=True),
        sa.Column("pcie_rx_bytes", sa.Double(), nullable=True),
        sa.Column("nvlink_tx_bytes", sa.Double(), nullable=True),
        sa.Column("nvlink_rx_bytes", sa.Double(), nullable=True),
        sa.Column("extra", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.create_index("ix_metric_samples_job_id_ts", "metric_samples", ["job_id", "ts"], unique=False)
    op.create_index("ix_metric_samples_node_id_ts", "metric_samples", ["node_id", "ts"], unique=False)
    op.create_table(
        "notification_channels",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("kind IN ('slack', 'lark', 'json')", name=op.f("ck_notification_channels_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notification_channels")),
        sa.UniqueConstraint("name", name=op.f("uq_notification_channels_name")),
    )
    op.create_table(
        "process_snapshots",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("local_rank", sa.Integer(), nullable=True),
        sa.Column("cpu_pct", sa.Float(), nullable=True),
        sa.Column("rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("state", sa.Text(), nullable=True),
        sa.Column("children", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_process_snapshots")),
    )
    op.create_index("ix_process_snapshots_job_id_ts", "process_snapshots", ["job_id", "ts"], unique=False)
    op.create_index("ix_process_snapshots_node_id_ts", "process_snapshots", ["node_id", "ts"], unique=False)
    op.create_table(
        "stack_dumps",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("directive_id", sa.Text(), nullable=True),
        sa.Column("threads", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stack_dumps")),
    )
    op.create_index("ix_stack_dumps_job_id_ts", "stack_dumps", ["job_id", "ts"], unique=False)
    op.create_table(
        "incidents",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), server_default="open", nullable=False),
        sa.Column("root_cause", sa.Text(), nullable=False),
        sa.Column("blame", sa.Text(), server_default="unknown", nullable=False),
        sa.Column("severity", sa.Text(), server_default="major", nullable=False),
        sa.Column("confidence", sa.Float(), server_default="0", nullable=False),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column(
            "suspects", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        sa.Column("opened_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("blame IN ('infrastructure', 'user_code', 'unknown')", name=op.f("ck_incidents_blame")),
        sa.CheckConstraint("state IN ('open', 'mitigating', 'resolved')", name=op.f("ck_incidents_state")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_incidents_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
    )
    op.create_index(
        "uq_incidents_open_job_root_cause",
        "incidents",
        ["job_id", "root_cause"],
        unique=True,
        postgresql_where=sa.text("state <> 'resolved'"),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), server_default="healthy", nullable=False),
        sa.Column("state_changed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("agent_version", sa.Text(), nullable=True),
        sa.Column("current_job_id", sa.BigInteger(), nullable=True),
        sa.Column("labels", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "state IN ('healthy', 'suspect', 'cordoned', 'evicted', 'in_repair', 'returned')",
            name=op.f("ck_nodes_state"),
        ),
        sa.ForeignKeyConstraint(
            ["current_job_id"], ["jobs.id"], name=op.f("fk_nodes_current_job_id_jobs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
    )
    op.create_table(
        "agent_batches",
        sa.Column("batch_id", sa.Uuid(), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("n_metrics", sa.Integer(), nullable=False),
        sa.Column("n_logs", sa.Integer(), nullable=False),
        sa.Column("n_stacks", sa.Integer(), nullable=False),
        sa.Column("n_processes", sa.Integer(), nullable=False),
        sa.Column("heartbeat", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_agent_batches_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_agent_batches")),
    )
    op.create_index("ix_agent_batches_received_at", "agent_batches", ["received_at"], unique=False)
    op.create_table(
        "decisions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("incident_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("outcome_message", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "kind IN ('evict', 'restart', 'rollback', 'diagnose', 'none')", name=op.f("ck_decisions_kind")
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'awaiting_approval', 'shadow', 'acknowledged', 'done', 'failed', 'rejected', 'expired')",
            name=op.f("ck_decisions_state"),
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name=op.f("fk_decisions_incident_id_incidents"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_decisions_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_decisions_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
    )
    op.create_index("ix_decisions_incident_id", "decisions", ["incident_id"], unique=False)
    op.create_index("ix_decisions_state_created_at", "decisions", ["state", "created_at"], unique=False)
    op.create_table(
        "findings",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("dedup_key", sa.Text(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("incident_id", sa.BigInteger(), nullable=True),
        sa.Column("node_id", sa.BigInteger(), nullable=True),
        sa.Column("detector", sa.Text(), nullable=False),
        sa.Column("category", sa.Text(), nullable=False),
        sa.Column("subject_kind", sa.Text(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("evidence", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("subject_kind IN ('job', 'node', 'gpu', 'rank')", name=op.f("ck_findings_subject_kind")),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name=op.f("fk_findings_incident_id_incidents"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_findings_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_findings_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_findings")),
        sa.UniqueConstraint("dedup_key", name=op.f("uq_findings_dedup_key")),
    )
    op.create_index("ix_findings_incident_id", "findings", ["incident_id"], unique=False)
    op.create_index("ix_findings_job_id_created_at", "findings", ["job_id", "created_at"], unique=False)
    op.create_table(
        "gpus",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("index", sa.SmallInteger(), nullable=False),
        sa.Column("uuid", sa.Text(), nullable=True),
        sa.Column("pci_bus_id", sa.Text(), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_gpus_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpus")),
    )
    op.create_index("uq_gpus_node_id_index", "gpus", ["node_id", "index"], unique=True)
    op.create_table(
        "ranks",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("local_rank", sa.Integer(), nullable=True),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_ranks_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_ranks_node_id_nodes"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "rank", name=op.f("pk_ranks")),
    )
    op.create_index("ix_ranks_node_id", "ranks", ["node_id"], unique=False)
    op.create_table(
        "node_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("incident_id", sa.BigInteger(), nullable=True),
        sa.Column("decision_id", sa.BigInteger(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("from_state", sa.Text(), nullable=True),
        sa.Column("to_state", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["decision_id"], ["decisions.id"], name=op.f("fk_node_events_decision_id_decisions"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name=op.f("fk_node_events_incident_id_incidents"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_node_events_job_id_jobs"), ondelete="SET NULL"),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_events_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_events")),
    )
    op.create_index("ix_node_events_node_id_at", "node_events", ["node_id", "at"], unique=False)
    op.create_table(
        "notification_deliveries",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("channel_id", sa.BigInteger(), nullable=False),
        sa.Column("event_key", sa.Text(), nullable=False),
        sa.Column("incident_id", sa.BigInteger(), nullable=True),
        sa.Column("decision_id", sa.BigInteger(), nullable=True),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('pending', 'sent', 'failed')", name=op.f("ck_notification_deliveries_state")),
        sa.ForeignKeyConstraint(
            ["channel_id"],
            ["notification_channels.id"],
            name=op.f("fk_notification_deliveries_channel_id_notification_channels"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name=op.f("fk_notification_deliveries_decision_id_decisions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["incidents.id"],
            name=op.f("fk_notification_deliveries_incident_id_incidents"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notification_deliveries")),
    )
    op.create_index(
        "ix_notification_deliveries_state_next_attempt_at",
        "notification_deliveries",
        ["state", "next_attempt_at"],
        unique=False,
    )
    op.create_index(
        "uq_notification_deliveries_channel_event", "notification_deliveries", ["channel_id", "event_key"], unique=True
    )


def downgrade() -> None:

    op.drop_index("uq_notification_deliveries_channel_event", table_name="notification_deliveries")
    op.drop_index("ix_notification_deliveries_state_next_attempt_at", table_name="notification_deliveries")
    op.drop_table("notification_deliveries")
    op.drop_index("ix_node_events_node_id_at", table_name="node_events")
    op.drop_table("node_events")
    op.drop_index("ix_ranks_node_id", table_name="ranks")
    op.drop_table("ranks")
    op.drop_index("uq_gpus_node_id_index", table_name="gpus")
    op.drop_table("gpus")
    op.drop_index("ix_findings_job_id_created_at", table_name="findings")
    op.drop_index("ix_findings_incident_id", table_name="findings")
    op.drop_table("findings")
    op.drop_index("ix_decisions_state_created_at", table_name="decisions")
    op.drop_index("ix_decisions_incident_id", table_name="decisions")
    op.drop_table("decisions")
    op.drop_index("ix_agent_batches_received_at", table_name="agent_batches")
    op.drop_table("agent_batches")
    op.drop_table("nodes")
    op.drop_index(
        "uq_incidents_open_job_root_cause", table_name="incidents", postgresql_where=sa.text("state <> 'resolved'")
    )
    op.drop_table("incidents")
    op.drop_index("ix_stack_dumps_job_id_ts", table_name="stack_dumps")
    op.drop_table("stack_dumps")
    op.drop_index("ix_process_snapshots_node_id_ts", table_name="process_snapshots")
    op.drop_index("ix_process_snapshots_job_id_ts", table_name="process_snapshots")
    op.drop_table("process_snapshots")
    op.drop_table("notification_channels")
    op.drop_index("ix_metric_samples_node_id_ts", table_name="metric_samples")
    op.drop_index("ix_metric_samples_job_id_ts", table_name="metric_samples")
    op.drop_table("metric_samples")
    op.drop_index("ix_log_events_node_id_ts", table_name="log_events")
    op.drop_index("ix_log_events_job_id_ts", table_name="log_events")
    op.drop_table("log_events")
    op.drop_table("jobs")
    op.drop_table("api_tokens")
