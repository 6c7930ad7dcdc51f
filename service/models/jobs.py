"""Training jobs and the mapping of their ranks onto machines."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Identity, Index, Integer, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

JOB_STATES = ("running", "finished", "failed")
JOB_SOURCES = ("registered", "agent")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(in_check("state", JOB_STATES), name="state"),
        CheckConstraint(in_check("source", JOB_SOURCES), name="source"),
        Index("ix_jobs_scheduler_job_id", "scheduler_job_id", postgresql_where=text("state = 'running'")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # The scheduler's id for the job (Slurm job id, torchelastic run id, ...).
    external_id: Mapped[str] = mapped_column(Text, unique=True)
    world_size: Mapped[int | None] = mapped_column(Integer)
    tp: Mapped[int | None] = mapped_column(Integer)
    pp: Mapped[int | None] = mapped_column(Integer)
    dp: Mapped[int | None] = mapped_column(Integer)
    # Which dimension varies fastest along the global rank, e.g. "tp-dp-pp" (Megatron's default).
    rank_order: Mapped[str | None] = mapped_column(Text)
    hang_timeout_s: Mapped[int] = mapped_column(Integer, server_default="600")
    state: Mapped[str] = mapped_column(Text, server_default="running")
    source: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = created_at_column()
    last_seen_at: Mapped[datetime | None]
    # How dcgm-exporter's labels name the job's GPUs when no training process does (service/ingest/attribution.py):
    # Kubernetes pods in this namespace whose names start with the prefix, or the scheduler's (HPC) job id.
    pods_namespace: Mapped[str | None] = mapped_column(Text)
    pods_prefix: Mapped[str | None] = mapped_column(Text)
    scheduler_job_id: Mapped[str | None] = mapped_column(Text)


class Rank(Base):
    __tablename__ = "ranks"
    __table_args__ = (Index("ix_ranks_node_id", "node_id"),)

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    local_rank: Mapped[int | None] = mapped_column(Integer)
    gpu_index: Mapped[int | None] = mapped_column(Integer)
    pid: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = created_at_column()
