"""Raw evidence shipped by agents: batches, GPU counters, log events, stacks, process snapshots."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    REAL,
    BigInteger,
    Column,
    DateTime,
    Double,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    Uuid,
    column,
    func,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.sql.selectable import TableValuedAlias

from ml.metrics import METRIC_COLUMNS, NVLINK_RX_BYTES, NVLINK_TX_BYTES, PCIE_RX_BYTES, PCIE_TX_BYTES
from ml.node_metrics import NODE_COLUMNS
from service.models.base import Base, created_at_column


class AgentBatch(Base):
    """One accepted batch: its id is the idempotency key, so a replayed batch is stored once."""

    __tablename__ = "agent_batches"
    __table_args__ = (Index("ix_agent_batches_received_at", "received_at"),)

    batch_id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    sent_at: Mapped[datetime]
    received_at: Mapped[datetime] = created_at_column()
    n_metrics: Mapped[int] = mapped_column(Integer)
    n_logs: Mapped[int] = mapped_column(Integer)
    n_stacks: Mapped[int] = mapped_column(Integer)
    n_processes: Mapped[int] = mapped_column(Integer)
    heartbeat: Mapped[dict[str, Any] | None] = mapped_column(JSONB)


# One row per GPU per timestamp, DCGM fields as columns. No primary key on purpose: this is the
# hottest table, written by COPY; batch ids already make writes idempotent. Partitioned by hour of ts
# (service/maintenance/partitions.py): retention drops whole partitions. It holds the recent hours only: beat
# compacts closed hours into metric_chunks (service/maintenance/compaction.py). Read samples through
# gpu_samples() below, which sees both.
metric_samples = Table(
    "metric_samples",
    Base.metadata,
    Column("ts", DateTime(timezone=True), nullable=False),
    Column("node_id", BigInteger, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    Column("job_id", BigInteger, nullable=True),
    *(Column(name, Double if counter else REAL) for name, (_, counter) in METRIC_COLUMNS.items()),
    Column("extra", JSONB, nullable=True),
    Index("ix_metric_samples_job_id_ts", "job_id", "ts"),
    Index("ix_metric_samples_node_id_ts", "node_id", "ts"),
    Index("ix_metric_samples_ts", "ts", postgresql_using="brin"),
    postgresql_partition_by="RANGE (ts)",
)

METRIC_SAMPLE_COLUMNS: tuple[str, ...] = tuple(c.name for c in metric_samples.columns)
# PostgreSQL type names of those columns, for binary COPY.
METRIC_COPY_TYPES: tuple[str, ...] = (
    "timestamptz",
    "int8",
    "int2",
    "int8",
    *("float8" if counter else "float4" for _, counter in METRIC_COLUMNS.values()),
    "jsonb",
)


# The PCIe and NVLink byte rates: float8 in the rows for their magnitude, float4 in the chunks, where their noise
# would cost 8 incompressible bytes a value (service/maintenance/compaction.py says why that is precise enough).
RATES_AS_REAL: frozenset[str] = frozenset({PCIE_TX_BYTES, PCIE_RX_BYTES, NVLINK_TX_BYTES, NVLINK_RX_BYTES})

# Closed hours of metric_samples, one row per node, GPU and job for an hour: the times and each column as an array
# in sample order (service/maintenance/compaction.py says how they are encoded). Created by migration 0031 from
# the columns metric_samples has; this Table is for reference, nothing writes it through SQLAlchemy.
metric_chunks = Table(
    "metric_chunks",
    Base.metadata,
    Column("node_id", BigInteger, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    Column("job_id", BigInteger, nullable=True),
    Column("ts_start", DateTime(timezone=True), nullable=False),
    Column("ts_end", DateTime(timezone=True), nullable=False),
    Column("n", Integer, nullable=False),
    # A regular series' step (its times are ts_start + k * step_us); else each sample's offset in ts_off.
    Column("step_us", BigInteger, nullable=True),
    Column("ts_off", ARRAY(BigInteger), nullable=True),
    # The counters stored as deltas (the first value, then increments).
    Column("deltas", ARRAY(Text), nullable=True),
    *(
        Column(name, ARRAY(Double if counter and name not in RATES_AS_REAL else REAL))
        for name, (_, counter) in METRIC_COLUMNS.items()
    ),
    Column("extra", ARRAY(JSONB), nullable=True),
    Index("ix_metric_chunks_node_id_ts_start", "node_id", "ts_start"),
    Index("ix_metric_chunks_job_id_ts_start", "job_id", "ts_start"),
    postgresql_partition_by="RANGE (ts_start)",
)


def gpu_samples(since: datetime, until: datetime | None = None) -> TableValuedAlias:
    """The GPU samples with `since` <= ts < `until` (None: no upper bound), shaped as metric_samples rows, whether
    still rows or compacted: the SQL function gpu_samples(lo, hi), which PostgreSQL inlines, so the bounds prune
    partitions of both tables and further filters (node, job) use their indexes."""
    upper = until if until is not None else literal_column("'infinity'::timestamptz")
    return func.gpu_samples(since, upper).table_valued(*(column(c.name, c.type) for c in metric_samples.columns))


# One row per node, subject (a port, the host, a volume) and timestamp; written by COPY like metric_samples.
node_samples = Table(
    "node_samples",
    Base.metadata,
    Column("ts", DateTime(timezone=True), nullable=False),
    Column("node_id", BigInteger, nullable=False),
    Column("job_id", BigInteger, nullable=True),
    Column("subject", Text, nullable=False),
    *(Column(name, Double if counter else REAL) for name, counter in NODE_COLUMNS.items()),
    Index("ix_node_samples_job_id_ts", "job_id", "ts"),
    Index("ix_node_samples_node_id_ts", "node_id", "ts"),
    postgresql_partition_by="RANGE (ts)",
)

NODE_SAMPLE_COLUMNS: tuple[str, ...] = tuple(c.name for c in node_samples.columns)
NODE_COPY_TYPES: tuple[str, ...] = (
    "timestamptz",
    "int8",
    "int8",
    "text",
    *("float8" if counter else "float4" for counter in NODE_COLUMNS.values()),
)


class LogEvent(Base):
    """A log line (or multi-line event) the agent parsed: kernel, training, NCCL."""

    __tablename__ = "log_events"
    __table_args__ = (
        Index("ix_log_events_job_id_ts", "job_id", "ts"),
        Index("ix_log_events_node_id_ts", "node_id", "ts"),
        # Alertmanager resends an alert on every group interval: one row per fingerprint and start.
        Index(
            "uq_log_events_alert",
            text("(fields ->> 'fingerprint')"),
            "ts",
            unique=True,
            postgresql_where=text("source = 'alertmanager'"),
        ),
        {"postgresql_partition_by": "RANGE (ts)"},
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    batch_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    node_id: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    # Partitioned by day of ts, which a partitioned table's primary key must include.
    ts: Mapped[datetime] = mapped_column(primary_key=True)
    source: Mapped[str] = mapped_column(Text)
    path: Mapped[str | None] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text)
    severity: Mapped[str | None] = mapped_column(Text)
    rank: Mapped[int | None] = mapped_column(Integer)
    line: Mapped[str] = mapped_column(Text)
    fields: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    signature: Mapped[str | None] = mapped_column(Text)


class StackDump(Base):
    """A py-spy dump of one training process."""

    __tablename__ = "stack_dumps"
    __table_args__ = (
        Index("ix_stack_dumps_job_id_ts", "job_id", "ts"),
        Index("ix_stack_dumps_directive_id", "directive_id"),
        {"postgresql_partition_by": "RANGE (ts)"},
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    batch_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    node_id: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    # Partitioned by day of ts, which a partitioned table's primary key must include.
    ts: Mapped[datetime] = mapped_column(primary_key=True)
    rank: Mapped[int | None] = mapped_column(Integer)
    pid: Mapped[int] = mapped_column(Integer)
    directive_id: Mapped[str | None] = mapped_column(Text)
    threads: Mapped[list[Any] | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)


class ProcessSnapshot(Base):
    """One training process as the agent saw it at one moment."""

    __tablename__ = "process_snapshots"
    __table_args__ = (
        Index("ix_process_snapshots_job_id_ts", "job_id", "ts"),
        Index("ix_process_snapshots_node_id_ts", "node_id", "ts"),
        {"postgresql_partition_by": "RANGE (ts)"},
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    batch_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    node_id: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    # Partitioned by day of ts, which a partitioned table's primary key must include.
    ts: Mapped[datetime] = mapped_column(primary_key=True)
    pid: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int | None] = mapped_column(Integer)
    local_rank: Mapped[int | None] = mapped_column(Integer)
    cpu_pct: Mapped[float | None] = mapped_column(Float)
    rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    state: Mapped[str | None] = mapped_column(Text)
    children: Mapped[list[Any] | None] = mapped_column(JSONB)
