"""Chat channels and the webhook outbox: one delivery row per (event, channel)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Float, ForeignKey, Identity, Index, Integer, Text, true
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

CHANNEL_KINDS = ("slack", "lark", "json")
INCIDENT_EVENTS = ("opened", "decided", "resolved")
# About a machine rather than an incident: a scheduler put work on a node faultline held out of service, before its
# return gate passed (service/nodes/returns.py).
NODE_EVENTS = ("node_before_gate",)
# About the fleet rather than one incident or node: a shared cause (a switch, a driver version...) opened
# (service/shared_causes/); the fleet circuit breaker tripped (service/breaker/).
FLEET_EVENTS = ("shared_cause", "breaker_tripped")
# sending: claimed by a worker and committed before the POST, so a worker that dies mid-send never
# leaves a row another worker would post again.
DELIVERY_STATES = ("pending", "sending", "sent", "failed")


class NotificationChannel(Base):
    __tablename__ = "notification_channels"
    __table_args__ = (CheckConstraint(in_check("kind", CHANNEL_KINDS), name="kind"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    kind: Mapped[str] = mapped_column(Text)
    # A secret (it carries the webhook's key): never returned by the API or logged in full.
    url: Mapped[str] = mapped_column(Text)
    enabled: Mapped[bool] = mapped_column(server_default=true())
    created_at: Mapped[datetime] = created_at_column()
    # Events due within this many seconds of each other go out as one message.
    group_wait_s: Mapped[float] = mapped_column(Float, server_default="5")
    rate_limit_per_minute: Mapped[int] = mapped_column(Integer, server_default="10")
    author: Mapped[str | None] = mapped_column(Text)


class NotificationDelivery(Base):
    __tablename__ = "notification_deliveries"
    __table_args__ = (
        CheckConstraint(in_check("state", DELIVERY_STATES), name="state"),
        # The same event never goes to the same channel twice.
        Index("uq_notification_deliveries_channel_event", "channel_id", "event_key", unique=True),
        Index("ix_notification_deliveries_state_next_attempt_at", "state", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    channel_id: Mapped[int] = mapped_column(ForeignKey("notification_channels.id", ondelete="CASCADE"))
    event_key: Mapped[str] = mapped_column(Text)
    event: Mapped[str] = mapped_column(Text, server_default="opened")
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"))
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("decisions.id", ondelete="CASCADE"))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[str] = mapped_column(Text, server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = created_at_column()
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = created_at_column()
    sent_at: Mapped[datetime | None]
    claimed_at: Mapped[datetime | None]
    # Deliveries grouped into one chat message share it.
    message_key: Mapped[str | None] = mapped_column(Text)
