"""Per-GPU window aggregates of metric samples, and the detectors' running state between passes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    REAL,
    BigInteger,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Integer,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from ml.metrics import METRIC_COLUMNS, WINDOW_MAX_COLUMNS
from ml.node_metrics import NODE_COUNTERS, NODE_GAUGES
from service.models.base import Base

# One row per job, GPU and closed window (WINDOW_S): gauges as their mean, cumulative counters also as their
# maximum (`<column>_max`; the last value unless the counter reset inside the window). Partitioned by
# window_start; the primary key serves every read (a job's windows in a time range).
metric_windows = Table(
    "metric_windows",
    Base.metadata,
    Column("job_id", BigInteger, nullable=False),
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("node_id", BigInteger, nullable=False),
    Column("gpu", SmallInteger, nullable=False),
    Column("n", SmallInteger, nullable=False),
    Column("last_ts", DateTime(timezone=True), nullable=False),
    *(Column(name, Double if counter else REAL) for name, (_, counter) in METRIC_COLUMNS.items()),
    *(Column(f"{name}_max", Double) for name in WINDOW_MAX_COLUMNS),
    PrimaryKeyConstraint("job_id", "window_start", "node_id", "gpu", name="pk_metric_windows"),
    postgresql_partition_by="RANGE (window_start)",
)

# The same for node_samples: one row per job, node, subject and closed window; gauges as their mean, cumulative
# counters as their maximum only (their mean says nothing, and a window of 2,048 machines' ports is rolled up
# every 10 s).
node_windows = Table(
    "node_windows",
    Base.metadata,
    Column("job_id", BigInteger, nullable=False),
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("node_id", BigInteger, nullable=False),
    Column("subject", Text, nullable=False),
    Column("n", SmallInteger, nullable=False),
    Column("last_ts", DateTime(timezone=True), nullable=False),
    *(Column(name, REAL) for name in NODE_GAUGES),
    *(Column(f"{name}_max", Double) for name in NODE_COUNTERS),
    PrimaryKeyConstraint("job_id", "window_start", "node_id", "subject", name="pk_node_windows"),
    postgresql_partition_by="RANGE (window_start)",
)


# Which metric columns a job's agents have reported (`source` "gpu": metric_samples, "node": node_samples), written
# by ingest as new ones arrive: the window rollup aggregates only these. A dcgm-exporter node reports about 20
# of the GPU columns, and each aggregate left out is one function call per sample row fewer (16,384 GPUs roll up
# 163,840 rows a window).
job_columns = Table(
    "job_columns",
    Base.metadata,
    Column("job_id", BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("source", Text, nullable=False),
    Column("name", Text, nullable=False),
    PrimaryKeyConstraint("job_id", "source", "name", name="pk_job_columns"),
)


# The detector_states row a job's full diagnosis pass writes as it ends (cursor: the pass's clock): the jobs API's
# `diagnosed_at`, which tells a replay when everything it sent has been read.
FULL_PASS = "full_pass"


class DetectorState(Base):
    """What a detector carried over from a job's previous pass; `version` invalidates state of older code."""

    __tablename__ = "detector_states"

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    detector: Mapped[str] = mapped_column(Text, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    cursor: Mapped[datetime | None]
    state: Mapped[dict[str, Any]] = mapped_column(JSONB)
    updated_at: Mapped[datetime]
