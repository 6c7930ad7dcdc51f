"""Planned maintenance: a node's announced window (by a person or the cloud's scheduled events), and what faultline
did about it (the checkpoint request and drain ahead of it, the return gate after it)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ColumnElement,
    ForeignKey,
    Identity,
    Index,
    Select,
    Text,
    select,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

# Who announced it: a person (the API, the CLI) or the node's agent reading its cloud's scheduled events.
WINDOW_SOURCES = ("operator", "cloud:aws", "cloud:gcp", "cloud:azure")


class MaintenanceWindow(Base):
    __tablename__ = "maintenance_windows"
    __table_args__ = (
        CheckConstraint(in_check("source", WINDOW_SOURCES), name="source"),
        CheckConstraint("ends_at > starts_at", name="window"),
        Index("ix_maintenance_windows_node_id_starts_at", "node_id", "starts_at"),
        # The beat reads only the windows it still has work on.
        Index("ix_maintenance_windows_open", "ends_at", postgresql_where=text("returned_at IS NULL")),
        # A cloud event is reported on every poll: one window per event and node.
        Index(
            "uq_maintenance_windows_node_id_source_external_id",
            "node_id",
            "source",
            "external_id",
            unique=True,
            postgresql_where=text("external_id IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    reason: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    # The cloud's id of the event (AWS event id, Azure EventId, GCP's maintenance event); null for a person's.
    external_id: Mapped[str | None] = mapped_column(Text)
    author: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    cancelled_at: Mapped[datetime | None]
    cancelled_by: Mapped[str | None] = mapped_column(Text)
    # Set when faultline asked the job to checkpoint and drained the node (the lead time before starts_at).
    prepared_at: Mapped[datetime | None]
    # The node silence that keeps its going down from counting as a fault, from the drain to the end plus a grace.
    silence_id: Mapped[int | None] = mapped_column(ForeignKey("silences.id", ondelete="SET NULL"))
    # The checkpoint request sent to the job running on the node then (null: no job ran there).
    checkpoint_directive_id: Mapped[str | None] = mapped_column(Text)
    # Set when the window is over for faultline: the node entered its return gate, or there was nothing to return.
    returned_at: Mapped[datetime | None]


def maintenance_silences() -> Select[tuple[int | None]]:
    """The silences planned maintenance windows made: incidents they covered are no failures (ETTR, repair figures)."""
    return select(MaintenanceWindow.silence_id).where(MaintenanceWindow.silence_id.is_not(None))


def not_planned(silence_id: ColumnElement[int | None]) -> ColumnElement[bool]:
    """True for an incident no planned maintenance window's silence covered."""
    return silence_id.is_(None) | silence_id.not_in(maintenance_silences())
