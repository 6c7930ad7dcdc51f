"""Error-looking log lines no rule knows, counted per form (ml/line_forms.py) at ingest: service/unknown_lines/."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Identity, Index, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column


class UnknownLineForm(Base):
    """One form: its masked text and the first line seen of it. Written once (ON CONFLICT DO NOTHING), so the
    ingest of a flood never queues on the row."""

    __tablename__ = "unknown_line_forms"

    form_id: Mapped[str] = mapped_column(Text, primary_key=True)
    form: Mapped[str] = mapped_column(Text)
    example: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)  # the example's
    created_at: Mapped[datetime] = created_at_column()


class UnknownLineCount(Base):
    """Lines of one form from one source, node and job within one UTC hour: a flush adds to its rows, so a
    form repeated every second on 2,048 nodes is 2,048 rows an hour, not a row per line. Pruned with the log
    events (service/unknown_lines/retention.py). No foreign keys, as on the signal tables it summarizes."""

    __tablename__ = "unknown_line_counts"
    __table_args__ = (
        # The upsert's key, and the window scans' index (by hour first). A line of no job counts under job 0.
        Index(
            "uq_unknown_line_counts_key",
            "hour",
            "form_id",
            "source",
            "node_id",
            text("COALESCE(job_id, 0)"),
            unique=True,
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    hour: Mapped[datetime]
    form_id: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    node_id: Mapped[int] = mapped_column(BigInteger)
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(BigInteger)
    first_seen_at: Mapped[datetime]
    last_seen_at: Mapped[datetime]
