"""What detectors conclude: findings, grouped into incidents, turned into decisions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, Float, ForeignKey, Identity, Index, SmallInteger, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from ml.findings import Finding as MlFinding
from service.models.base import Base, created_at_column, in_check

SUBJECT_KINDS = ("job", "node", "gpu", "rank")
INCIDENT_STATES = ("open", "mitigating", "resolved")
BLAMES = ("infrastructure", "user_code", "unknown")
# cordon and return are node-level: an operator's manual cordon, a node back to service; the scheduler acts on them too.
# reset_gpu names a node and one of its GPUs (`gpu`, else `gpu_pci`): reset that GPU, keep the node.
DECISION_KINDS = ("evict", "restart", "rollback", "diagnose", "none", "cordon", "return", "reset_gpu")
DECISION_STATES = (
    "pending",
    "awaiting_approval",
    "shadow",
    "acknowledged",
    "done",
    "failed",
    "rejected",
    "expired",
)


class Finding(Base):
    """One detector's claim about a subject, with confidence and references to its evidence."""

    __tablename__ = "findings"
    __table_args__ = (
        CheckConstraint(in_check("subject_kind", SUBJECT_KINDS), name="subject_kind"),
        Index("ix_findings_job_id_created_at", "job_id", "created_at"),
        Index("ix_findings_incident_id", "incident_id"),
        Index("ix_findings_node_id", "node_id"),
        Index("ix_findings_created_at", "created_at"),
        Index("ix_findings_job_id_series_key", "job_id", "series_key", postgresql_where=text("series_key IS NOT NULL")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # Detectors re-run; the same claim about the same evidence is stored once.
    dedup_key: Mapped[str] = mapped_column(Text, unique=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    detector: Mapped[str] = mapped_column(Text)
    category: Mapped[str] = mapped_column(Text)
    subject_kind: Mapped[str] = mapped_column(Text)
    subject: Mapped[str] = mapped_column(Text)
    confidence: Mapped[float] = mapped_column(Float)
    summary: Mapped[str] = mapped_column(Text)
    # What the detector concluded on its own: who is to blame, cause or symptom, what it would do.
    blame: Mapped[str] = mapped_column(Text, server_default="unknown")
    role: Mapped[str] = mapped_column(Text, server_default="cause")
    action: Mapped[str] = mapped_column(Text, server_default="none")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB)
    observed_at: Mapped[datetime]
    created_at: Mapped[datetime] = created_at_column()
    # An ongoing claim (a counter still climbing) is one row that each pass updates: the claim's identity
    # without its moment, and the last pass that saw it move (observed_at stays the first time).
    series_key: Mapped[str | None] = mapped_column(Text)
    last_seen_at: Mapped[datetime | None]

    def to_ml(self, node: str | None) -> MlFinding:
        """The stored claim in the detectors' shape (its node's name given: the row keeps only its id)."""
        return MlFinding(
            detector=self.detector,
            category=self.category,
            subject_kind=self.subject_kind,
            subject=self.subject,
            confidence=self.confidence,
            summary=self.summary,
            observed_at=self.observed_at,
            node=node,
            blame=self.blame,
            role=self.role,
            action=self.action,
            key=self.dedup_key,
            seen_until=self.last_seen_at,
            evidence=self.evidence,
        )


class Incident(Base):
    """Findings of one job grouped in time, with root cause, blame and ranked suspects."""

    __tablename__ = "incidents"
    __table_args__ = (
        CheckConstraint(in_check("state", INCIDENT_STATES), name="state"),
        CheckConstraint(in_check("blame", BLAMES), name="blame"),
        # One open incident per job, root cause and machine, even with concurrent workers.
        Index(
            "uq_incidents_open_job_root_cause_anchor",
            "job_id",
            "root_cause",
            "anchor",
            unique=True,
            postgresql_where=text("state <> 'resolved'"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    state: Mapped[str] = mapped_column(Text, server_default="open")
    root_cause: Mapped[str] = mapped_column(Text)
    # The machine a machine fault's incident is about; '' for a job-wide one (a hang being localized, a user's bug).
    anchor: Mapped[str] = mapped_column(Text, server_default="")
    blame: Mapped[str] = mapped_column(Text, server_default="unknown")
    severity: Mapped[str] = mapped_column(Text, server_default="major")
    confidence: Mapped[float] = mapped_column(Float, server_default="0")
    summary: Mapped[str | None] = mapped_column(Text)
    suspects: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    opened_at: Mapped[datetime] = created_at_column()
    updated_at: Mapped[datetime] = created_at_column()
    resolved_at: Mapped[datetime | None]
    # Why it resolved: mitigated by a decision, quiet, merged, or closed by a person.
    resolution: Mapped[str | None] = mapped_column(Text)
    # Who resolved it by hand (the token's actor); null when it resolved by itself.
    resolved_by: Mapped[str | None] = mapped_column(Text)
    # Who said "I'm on it" last, and when; every acknowledgement ({"actor", "at", "note"}, oldest first) stays in
    # `acknowledgements`, the incident's record of who took it. None of it changes the state or the decisions.
    acknowledged_by: Mapped[str | None] = mapped_column(Text)
    acknowledged_at: Mapped[datetime | None]
    acknowledgements: Mapped[list[Any]] = mapped_column(JSONB, server_default=text("'[]'::jsonb"))
    # The maintenance window that covered it: its findings are kept, but it decides and alerts nothing.
    silence_id: Mapped[int | None] = mapped_column(ForeignKey("silences.id", ondelete="SET NULL"))


class Decision(Base):
    """An action proposed for an incident, and its lifecycle up to the scheduler's acknowledgement."""

    __tablename__ = "decisions"
    __table_args__ = (
        CheckConstraint(in_check("kind", DECISION_KINDS), name="kind"),
        CheckConstraint(in_check("state", DECISION_STATES), name="state"),
        CheckConstraint("(kind = 'reset_gpu') = (gpu IS NOT NULL OR gpu_pci IS NOT NULL)", name="gpu"),
        CheckConstraint(r"gpu_pci ~ '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$'", name="gpu_pci"),
        Index("ix_decisions_state_created_at", "state", "created_at"),
        Index("ix_decisions_incident_id", "incident_id"),
        # One decision of a kind per incident and node, however many workers decide concurrently.
        Index("uq_decisions_incident_kind_node", "incident_id", "kind", text("coalesce(node_id, 0)"), unique=True),
        Index("ix_decisions_node_id_created_at", "node_id", "created_at"),
        Index("ix_decisions_job_id_created_at", "job_id", "created_at"),
        # The escalation check reads one GPU's recent resets.
        Index(
            "ix_decisions_node_id_gpu_created_at",
            "node_id",
            "gpu",
            "created_at",
            postgresql_where=text("kind = 'reset_gpu'"),
        ),
        # One cordon per shared incident and node.
        Index(
            "uq_decisions_shared_incident_kind_node",
            "shared_incident_id",
            "kind",
            "node_id",
            unique=True,
            postgresql_where=text("shared_incident_id IS NOT NULL"),
        ),
        # The expiry sweep reads only pending decisions.
        Index("ix_decisions_expires_at_pending", "expires_at", postgresql_where=text("state = 'pending'")),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    # Null for an operator's cordon or a return to service: node decisions outside any incident.
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(Text)
    # The GPU index on the node, for reset_gpu; null for every other kind.
    gpu: Mapped[int | None] = mapped_column(SmallInteger)
    # For a reset_gpu whose index the node's GPU inventory does not know (no NVML on the node, a kernel-log-only
    # agent): the GPU's PCI bus id as the Xid line names it, with its function ("0000:3b:00.0"), which
    # `nvidia-smi -i` accepts as well as an index. A reset_gpu has `gpu` or this.
    gpu_pci: Mapped[str | None] = mapped_column(Text)
    state: Mapped[str] = mapped_column(Text)
    confidence: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    # The chain from this decision back to findings and the signals behind them.
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = created_at_column()
    expires_at: Mapped[datetime | None]
    acked_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(Text)
    outcome_message: Mapped[str | None] = mapped_column(Text)
    actor: Mapped[str | None] = mapped_column(Text)
    # A cordon decided for a shared component (a switch, a driver version...): its shared incident
    # (service/shared_causes/); incident_id is then null.
    shared_incident_id: Mapped[int | None] = mapped_column(ForeignKey("shared_incidents.id", ondelete="CASCADE"))
