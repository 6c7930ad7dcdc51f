"""Silences: maintenance windows during which a node's or a job's findings decide and alert nothing."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, CheckConstraint, Identity, Index, Text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column


class Silence(Base):
    __tablename__ = "silences"
    __table_args__ = (
        CheckConstraint("node_pattern IS NOT NULL OR job_pattern IS NOT NULL", name="matcher"),
        CheckConstraint("ends_at > starts_at", name="window"),
        Index("ix_silences_ends_at", "ends_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # Shell-style patterns (fnmatch): "gpu-node-01?", "llm-*"; both given means both must match.
    node_pattern: Mapped[str | None] = mapped_column(Text)
    job_pattern: Mapped[str | None] = mapped_column(Text)
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    author: Mapped[str] = mapped_column(Text)
    comment: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    # Set when someone ends the window early; the row stays for the record.
    expired_at: Mapped[datetime | None]
