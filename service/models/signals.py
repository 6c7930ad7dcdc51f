"""Raw evidence shipped by agents: batches, GPU counters, log events, stacks, process snapshots."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
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
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from ml.metrics import METRIC_COLUMNS
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
# (service/maintenance/partitions.py): retention drops whole partitions.
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
