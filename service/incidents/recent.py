"""What just happened: the incidents of the last hours, resolved ones included, each with its outcome (what was
decided, and what became of it). Incidents open and resolve within seconds, so a list of open ones reads "nothing"
before and after every fault; this is the overview's list for someone woken at 3 a.m."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Text, case, cast, func, or_, select
from sqlalchemy.orm import Session

from service.incidents.service import SEVERITIES
from service.models import Decision, Incident, Job, Node

RECENT_LIMIT = 50
_SEVERITY = case({s: i for i, s in enumerate(SEVERITIES)}, value=Incident.severity, else_=len(SEVERITIES))
# What a decision's state says happened, for a person: the scheduler's own message follows where it gave one.
_STATE_WORDS = {
    "pending": "waiting for a scheduler",
    "awaiting_approval": "waiting for a person's approval",
    "shadow": "recorded only (shadow mode)",
    "acknowledged": "acknowledged",
    "done": "done",
    "failed": "failed",
    "rejected": "rejected",
    "expired": "expired: nobody acted in time",
}


@dataclass(frozen=True)
class Outcome:
    """One decision of an incident and what became of it."""

    decision_id: int
    kind: str
    node: str | None
    gpu: str | None  # its index ("3"), else its PCI bus id (a reset_gpu the node's inventory could not index)
    state: str
    message: str | None  # the scheduler's or the person's words
    actor: str | None
    at: datetime  # acknowledged (or decided, while it waits)

    @property
    def action(self) -> str:
        """ "evict node-5", "reset GPU 3 on node-5", "restart the job", "no action"."""
        if self.kind == "reset_gpu":
            return f"reset GPU {self.gpu} on {self.node}"
        if self.kind == "none":
            return "no action"
        return f"{self.kind} {self.node}" if self.node else f"{self.kind} the job"

    @property
    def result(self) -> str:
        words = _STATE_WORDS.get(self.state, self.state)
        if self.state == "rejected" and self.actor:
            words = f"rejected by {self.actor}"
        return words

    @property
    def waiting(self) -> bool:
        return self.state in ("pending", "awaiting_approval")


@dataclass
class RecentIncident:
    id: int
    job_id: str
    state: str
    severity: str
    root_cause: str
    blame: str
    confidence: float
    summary: str | None
    suspects: list[str]
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    resolution: str | None
    resolved_by: str | None
    silenced: bool
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def open_for_s(self) -> float | None:
        """How long it was open, once resolved."""
        return (self.resolved_at - self.opened_at).total_seconds() if self.resolved_at else None


def _recent_since(since: datetime):  # type: ignore[no-untyped-def]
    """Open now, or opened or resolved since `since`; not merged away (another incident holds its findings)."""
    return (
        or_(Incident.state != "resolved", Incident.opened_at >= since, Incident.resolved_at >= since),
        or_(Incident.resolution.is_(None), ~Incident.resolution.startswith("merged")),
    )


def recent(session: Session, *, since: datetime, limit: int = RECENT_LIMIT) -> tuple[list[RecentIncident], int]:
    """Incidents open now or opened or resolved since `since`, with their decisions' outcomes: the open ones first
    (most severe, newest), then the resolved ones, the latest resolved first. Also how many more there are. Three
    queries, however many incidents."""
    where = _recent_since(since)
    rows = session.execute(
        select(Incident, Job.external_id)
        .join(Job, Job.id == Incident.job_id)
        .where(*where)
        .order_by(
            (Incident.state == "resolved").asc(),
            case((Incident.state != "resolved", _SEVERITY), else_=0),
            func.coalesce(Incident.resolved_at, Incident.opened_at).desc(),
            Incident.id.desc(),
        )
        .limit(limit)
    ).all()
    total = session.scalar(select(func.count()).select_from(Incident).where(*where)) or 0
    outcomes = _outcomes(session, incident_ids=[i.id for i, _ in rows])
    items = [
        RecentIncident(
            id=i.id,
            job_id=job_id,
            state=i.state,
            severity=i.severity,
            root_cause=i.root_cause,
            blame=i.blame,
            confidence=i.confidence,
            summary=i.summary,
            suspects=[s["node"] for s in (i.suspects or [])[:3] if s.get("node")],
            opened_at=i.opened_at,
            updated_at=i.updated_at,
            resolved_at=i.resolved_at,
            resolution=i.resolution,
            resolved_by=i.resolved_by,
            silenced=i.silence_id is not None,
            outcomes=outcomes.get(i.id, []),
        )
        for i, job_id in rows
    ]
    return items, max(0, total - len(items))


def _outcomes(session: Session, *, incident_ids: list[int]) -> dict[int, list[Outcome]]:
    if not incident_ids:
        return {}
    rows = session.execute(
        select(
            Decision.incident_id,
            Decision.id,
            Decision.kind,
            Node.name,
            func.coalesce(cast(Decision.gpu, Text), Decision.gpu_pci),
            Decision.state,
            Decision.outcome_message,
            Decision.actor,
            func.coalesce(Decision.acked_at, Decision.created_at),
        )
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(Decision.incident_id.in_(incident_ids))
        .order_by(Decision.id)
    ).all()
    out: dict[int, list[Outcome]] = {}
    for incident_id, *rest in rows:
        out.setdefault(incident_id, []).append(Outcome(*rest))
    return out
