"""node signals: node_samples/node_windows (network ports, host, volumes) and the NVML fallback's GPU columns

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 19:00:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from service.maintenance import partitions

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As of this revision (ml/metrics.py and ml/node_metrics.py may grow; a later migration adds its columns).
_GPU_GAUGES = [
    "row_remap_pending",
    "retired_pages_pending",
    "pcie_link_gen",
    "pcie_link_width",
    "pcie_max_link_gen",
    "pcie_max_link_width",
    "nvlink_links_down",
]
_GPU_COUNTERS = ["retired_pages_sbe", "retired_pages_dbe", "ecc_sbe_aggregate", "ecc_dbe_aggregate"]
_GPU_MAX = ["retired_pages_sbe", "retired_pages_dbe", "ecc_sbe_aggregate", "ecc_dbe_aggregate",
            "row_remap_pending", "retired_pages_pending", "nvlink_links_down"]  # fmt: skip

_NODE_GAUGES = [
    "port_state", "port_phys_state", "port_rate_gbps",
    "cpu_util_pct", "cpu_steal_pct", "cpu_steal_max_core_pct", "cpu_iowait_pct", "cpu_iowait_max_core_pct",
    "load1", "mem_total_mib", "mem_available_mib", "swap_used_mib",
    "psi_cpu_some_avg10", "psi_mem_some_avg10", "psi_mem_full_avg10", "psi_io_some_avg10", "psi_io_full_avg10",
    "nvidia_driver_loaded", "fabric_manager_running", "disk_free_bytes", "disk_total_bytes", "disk_free_pct",
]  # fmt: skip
_NODE_COUNTERS = [
    "link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors", "port_xmit_discards", "port_xmit_wait",
    "local_link_integrity_errors", "excessive_buffer_overrun_errors", "port_rcv_bytes", "port_xmit_bytes",
    "np_cnp_sent", "rp_cnp_handled", "out_of_buffer", "pause_rx_frames", "pause_tx_frames",
    "rx_errors", "tx_errors", "rx_dropped", "tx_dropped", "mce_events", "edac_ce", "edac_ue",
]  # fmt: skip


def _node_columns() -> list[sa.Column]:
    return [
        *(sa.Column(name, sa.REAL()) for name in _NODE_GAUGES),
        *(sa.Column(name, sa.Double()) for name in _NODE_COUNTERS),
    ]


def _ensure_partitions(table: str) -> None:
    op.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
    spec = partitions.REGISTRY[table]
    now = datetime.now(UTC)
    partitions.ensure_table_partitions(
        op.get_bind(), spec, start=spec.period.floor(now), end=now + partitions.DEFAULT_AHEAD
    )


def upgrade() -> None:
    # Adding nullable columns to a partitioned table adds them to every partition without rewriting rows.
    for table in ("metric_samples", "metric_windows"):
        for name in _GPU_GAUGES:
            op.add_column(table, sa.Column(name, sa.REAL()))
        for name in _GPU_COUNTERS:
            op.add_column(table, sa.Column(name, sa.Double()))
    for name in _GPU_MAX:
        op.add_column("metric_windows", sa.Column(f"{name}_max", sa.Double()))

    op.create_table(
        "node_samples",
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("subject", sa.Text(), nullable=False),
        *_node_columns(),
        postgresql_partition_by="RANGE (ts)",
    )
    op.create_index("ix_node_samples_job_id_ts", "node_samples", ["job_id", "ts"])
    op.create_index("ix_node_samples_node_id_ts", "node_samples", ["node_id", "ts"])
    _ensure_partitions("node_samples")
    op.create_table(
        "node_windows",
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("node_id", sa.BigInteger(), nullable=False),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("n", sa.SmallInteger(), nullable=False),
        sa.Column("last_ts", sa.DateTime(timezone=True), nullable=False),
        # Gauges as their mean, counters as their maximum only.
        *(sa.Column(name, sa.REAL()) for name in _NODE_GAUGES),
        *(sa.Column(f"{name}_max", sa.Double()) for name in _NODE_COUNTERS),
        sa.PrimaryKeyConstraint("job_id", "window_start", "node_id", "subject", name="pk_node_windows"),
        postgresql_partition_by="RANGE (window_start)",
    )
    _ensure_partitions("node_windows")


def downgrade() -> None:
    op.drop_table("node_windows")
    op.drop_table("node_samples")
    for name in _GPU_MAX:
        op.drop_column("metric_windows", f"{name}_max")
    for table in ("metric_samples", "metric_windows"):
        for name in (*_GPU_GAUGES, *_GPU_COUNTERS):
            op.drop_column(table, name)
