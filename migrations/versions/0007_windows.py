"""windows: per-GPU 10 s window aggregates of metric samples (partitioned by window_start), detector state

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 08:00:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from service.maintenance import partitions

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The metric columns as of this revision (ml/metrics.py may grow; a later migration adds its columns).
_GAUGES = [
    "gpu_util",
    "mem_copy_util",
    "enc_util",
    "dec_util",
    "sm_clock",
    "mem_clock",
    "gpu_temp",
    "memory_temp",
    "power_usage",
    "power_limit",
    "fb_free",
    "fb_used",
    "xid_last",
    "gr_engine_active",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "row_remap_failure",
]
_COUNTERS = [
    "clock_event_reasons",
    "total_energy",
    "pcie_replay",
    "power_violation",
    "thermal_violation",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "nvlink_bandwidth_total",
    "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "pcie_tx_bytes",
    "pcie_rx_bytes",
    "nvlink_tx_bytes",
    "nvlink_rx_bytes",
]
_MAX = (*_COUNTERS, "xid_last", "row_remap_failure")


def upgrade() -> None:
    op.create_table(
        "metric_windows",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("gpu", sa.SmallInteger(), nullable=False),
        sa.Column("n", sa.SmallInteger(), nullable=False),
        sa.Column("last_ts", sa.DateTime(timezone=True), nullable=False),
        *(sa.Column(name, sa.REAL()) for name in _GAUGES),
        *(sa.Column(name, sa.Double()) for name in _COUNTERS),
        *(sa.Column(f"{name}_max", sa.Double()) for name in _MAX),
        sa.PrimaryKeyConstraint("job_id", "window_start", "node_id", "gpu", name="pk_metric_windows"),
        postgresql_partition_by="RANGE (window_start)",
    )
    op.execute("CREATE TABLE metric_windows_default PARTITION OF metric_windows DEFAULT")
    # Today's and the next hours' partitions now; beat keeps making them ahead (service/maintenance/partitions.py).
    spec = partitions.REGISTRY["metric_windows"]
    now = datetime.now(UTC)
    partitions.ensure_table_partitions(
        op.get_bind(), spec, start=spec.period.floor(now), end=now + partitions.DEFAULT_AHEAD
    )
    op.create_table(
        "detector_states",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("detector", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("cursor", sa.DateTime(timezone=True), nullable=True),
        sa.Column("state", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "detector", name=op.f("pk_detector_states")),
    )


def downgrade() -> None:
    op.drop_table("detector_states")
    op.drop_table("metric_windows")
