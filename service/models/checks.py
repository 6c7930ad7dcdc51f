"""Stop-time check results the agents ship (agents/checks), each with the service's own verdict on it."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Float, ForeignKey, Identity, Index, Text, Uuid, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

# The agent's status; "refused": the suite did not run (the node still ran a job's ranks, or a bad directive).
CHECK_STATUSES = ("pass", "fail", "not_available", "refused")
# What the service's verdict rests on: the fleet's passing runs, the datasheet floor, the agent's own judgment.
CHECK_BASES = ("fleet", "spec", "agent")


class CheckResult(Base):
    __tablename__ = "check_results"
    __table_args__ = (
        CheckConstraint(in_check("status", CHECK_STATUSES), name="status"),
        CheckConstraint(in_check("verdict", CHECK_STATUSES), name="verdict"),
        CheckConstraint(in_check("basis", CHECK_BASES), name="basis"),
        Index("ix_check_results_node_id_ts", "node_id", "ts"),
        # The fleet's history of one check on one GPU model: only passing figures are read.
        Index(
            "ix_check_results_history",
            "check",
            "gpu_model",
            "ts",
            postgresql_where=text("verdict = 'pass' AND measured IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    batch_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    directive_id: Mapped[str | None] = mapped_column(Text)
    ts: Mapped[datetime]
    check: Mapped[str] = mapped_column(Text)
    subject: Mapped[str] = mapped_column(Text)  # "node", "host", "gpu:3", "ib:mlx5_0/1", "vol:/ckpt"
    gpu_model: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    verdict: Mapped[str] = mapped_column(Text)
    basis: Mapped[str] = mapped_column(Text)
    measured: Mapped[float | None] = mapped_column(Float)
    expected: Mapped[float | None] = mapped_column(Float)  # the agent's limit
    cutoff: Mapped[float | None] = mapped_column(Float)  # the service's limit (fleet or spec), when it judged
    unit: Mapped[str | None] = mapped_column(Text)
    duration_s: Mapped[float | None] = mapped_column(Float)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB)
    finding_id: Mapped[int | None] = mapped_column(ForeignKey("findings.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = created_at_column()
