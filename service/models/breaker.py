"""The fleet circuit breaker: one row every API and worker process reads and locks, and its audit trail."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Identity, Index, Integer, SmallInteger, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

BREAKER_STATES = ("closed", "tripped")
BREAKER_EVENT_KINDS = ("tripped", "reset")
BREAKER_ROW = 1


class FleetBreaker(Base):
    """The breaker's state: `closed` (automation acts) or `tripped` (take-outs wait for a person), with when and why
    it tripped and who reset it last. One row (id 1), locked by every decision that would take a node out."""

    __tablename__ = "fleet_breaker"
    __table_args__ = (
        CheckConstraint(f"id = {BREAKER_ROW}", name="one_row"),
        CheckConstraint(in_check("state", BREAKER_STATES), name="state"),
    )

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(Text, server_default="closed")
    tripped_at: Mapped[datetime | None]
    tripped_reason: Mapped[str | None] = mapped_column(Text)
    # At the trip: nodes out (the one that tripped it included), the fleet's size, and the most allowed out.
    out_nodes: Mapped[int | None] = mapped_column(Integer)
    fleet_nodes: Mapped[int | None] = mapped_column(Integer)
    limit_nodes: Mapped[int | None] = mapped_column(Integer)
    # The last reset: take-outs are counted from then on (the nodes already out were a person's call to keep).
    reset_at: Mapped[datetime | None]
    reset_by: Mapped[str | None] = mapped_column(Text)
    reset_reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = created_at_column()


class BreakerEvent(Base):
    """The audit trail: every trip (actor faultline) and every person's reset, with the reason given."""

    __tablename__ = "breaker_events"
    __table_args__ = (
        CheckConstraint(in_check("kind", BREAKER_EVENT_KINDS), name="kind"),
        Index("ix_breaker_events_at", "at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = created_at_column()
    actor: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    # The counts behind a trip (out, fleet, limit, the nodes counted); the decisions still held at a reset.
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
