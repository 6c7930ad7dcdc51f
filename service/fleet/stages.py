"""Repair-time histograms, observed where each stage completes (see ml/repair_times.py for the stages).

Labelled by stage only: node names or job ids as labels would grow without bound. The same definitions as the
stored repair times, so /metrics and /api/v1/repair-times agree; each is observed inside the transaction that
completes the stage (a rolled-back one still counts: rare, and Prometheus cannot take an observation back).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ml.repair_times import ACTED
from service.models import Decision, Finding, Incident, Node, NodeEvent
from service.observability import REPAIR_SECONDS

# States a node is out of service in (service/nodes/lifecycle.py's OUT_OF_SERVICE; not imported: it imports this).
OUT_OF_SERVICE = ("cordoned", "evicted", "in_repair")
# An incident takes a node out of service by one of these.
TAKEN_OUT = ("evicted", "cordoned")


def observe(stage: str, seconds: float) -> None:
    REPAIR_SECONDS.labels(stage=stage).observe(max(0.0, seconds))


def incident_opened(session: Session, *, finding_ids: Collection[int], now: datetime) -> None:
    """detect: from the earliest evidence of the findings that opened the incident."""
    if not finding_ids:
        return
    evidence_at = session.scalar(select(func.min(Finding.observed_at)).where(Finding.id.in_(finding_ids)))
    if evidence_at is not None:
        observe("detect", (now - evidence_at).total_seconds())


def has_decision(session: Session, *, incident_id: int) -> bool:
    return session.scalar(select(Decision.id).where(Decision.incident_id == incident_id).limit(1)) is not None


def incident_decided(incident: Incident, *, now: datetime) -> None:
    """decide: the incident's first decision was just stored."""
    observe("decide", (now - incident.opened_at).total_seconds())


def decision_acted(session: Session, *, decision: Decision, now: datetime) -> None:
    """act: a scheduler acknowledged an incident's decision as done or failed, the incident's first such ack."""
    if decision.incident_id is None or decision.state not in ACTED:
        return
    earlier = session.scalar(
        select(Decision.id)
        .where(Decision.incident_id == decision.incident_id, Decision.id != decision.id, Decision.state.in_(ACTED))
        .limit(1)
    )
    if earlier is None:
        observe("act", (now - decision.created_at).total_seconds())


def node_returning(session: Session, *, node: Node, now: datetime) -> None:
    """return: an out-of-service node goes back; counted when an incident took it out."""
    if node.state not in OUT_OF_SERVICE:
        return
    entry = session.execute(
        select(NodeEvent.at, NodeEvent.incident_id)
        .where(
            NodeEvent.node_id == node.id,
            NodeEvent.to_state.in_(OUT_OF_SERVICE),
            NodeEvent.from_state.not_in(OUT_OF_SERVICE),
        )
        .order_by(NodeEvent.at.desc(), NodeEvent.id.desc())
        .limit(1)
    ).first()
    if entry is not None and entry.incident_id is not None:
        observe("return", (now - entry.at).total_seconds())
