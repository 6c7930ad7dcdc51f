"""Machines, their GPUs, and their history across jobs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Identity, Index, SmallInteger, Text, false, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, created_at_column, in_check

# returning: back in a scheduler's service (or on its way there) and running its return gate, the stop-time checks.
NODE_STATES = ("healthy", "suspect", "cordoned", "evicted", "in_repair", "returning")
# What moved a node (service/nodes/lifecycle.py): faultline's diagnosis, a scheduler's acknowledgement of a decision,
# a scheduler reporting the node schedulable again, a job placing work on it (a rank map, its agent's ranks), a
# person, the stop-time checks' verdict, a planned maintenance window (service/planned/).
NODE_EVENT_SOURCES = ("diagnosis", "decision_ack", "scheduler", "placement", "person", "checks", "maintenance")


class Node(Base):
    __tablename__ = "nodes"
    __table_args__ = (
        CheckConstraint(in_check("state", NODE_STATES), name="state"),
        Index("ix_nodes_state", "state"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    state: Mapped[str] = mapped_column(Text, server_default="healthy")
    state_changed_at: Mapped[datetime] = created_at_column()
    last_seen_at: Mapped[datetime | None]
    agent_version: Mapped[str | None] = mapped_column(Text)
    current_job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    labels: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = created_at_column()
    state_reason: Mapped[str | None] = mapped_column(Text)
    # A machine that keeps turning up as a suspect across jobs: quarantined longer, flagged in the UI.
    lemon: Mapped[bool] = mapped_column(server_default=false())
    # Taken out of service until then; a return before it is refused.
    quarantined_until: Mapped[datetime | None]
    # A scheduler placed work on it while faultline held it out of service, before its return gate passed: shown
    # loudly until the gate answers or the node leaves service again.
    work_before_gate_at: Mapped[datetime | None]
    # The escalation ladder's top rung: the node went out for a vendor replacement (RMA), when and why (set when the
    # scheduler carried out that eviction). Its remedies before then are another machine's: the ladder starts afresh.
    rma_at: Mapped[datetime | None]
    rma_reason: Mapped[str | None] = mapped_column(Text)


class Gpu(Base):
    __tablename__ = "gpus"
    __table_args__ = (
        Index("uq_gpus_node_id_index", "node_id", "index", unique=True),
        Index(
            "ix_gpus_fabric_cluster_uuid",
            "fabric_cluster_uuid",
            postgresql_where=text("fabric_cluster_uuid IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(SmallInteger)
    uuid: Mapped[str | None] = mapped_column(Text)
    pci_bus_id: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str | None] = mapped_column(Text)
    last_seen_at: Mapped[datetime | None]
    # Its NVLink fabric (NVML's fabric info, migration 0024): the cluster is the NVLink domain (a GB200 NVL72 rack),
    # the clique the GPUs it reaches over NVLink; state (not_started, in_progress, completed), status (an NVML
    # return code, 0 once registered), health summary, degraded bandwidth and the global fabric manager's link.
    fabric_cluster_uuid: Mapped[str | None] = mapped_column(Text)
    fabric_clique_id: Mapped[int | None] = mapped_column(BigInteger)
    fabric_state: Mapped[str | None] = mapped_column(Text)
    fabric_status: Mapped[int | None]
    fabric_health: Mapped[str | None] = mapped_column(Text)
    fabric_degraded_bw: Mapped[bool | None]
    fabric_gfm: Mapped[str | None] = mapped_column(Text)
    fabric_at: Mapped[datetime | None]


class NodeEvent(Base):
    """One entry of a node's history: a state change, and who or what caused it."""

    __tablename__ = "node_events"
    __table_args__ = (
        Index("ix_node_events_node_id_at", "node_id", "at"),
        CheckConstraint(in_check("source", NODE_EVENT_SOURCES), name="source"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    decision_id: Mapped[int | None] = mapped_column(ForeignKey("decisions.id", ondelete="SET NULL"))
    at: Mapped[datetime] = created_at_column()
    kind: Mapped[str] = mapped_column(Text)
    from_state: Mapped[str | None] = mapped_column(Text)
    to_state: Mapped[str | None] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(Text)
    reason: Mapped[str | None] = mapped_column(Text)
    # E.g. the diagnostics report a return to service passed.
    details: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
