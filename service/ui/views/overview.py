"""The overview: open incidents by severity, decisions waiting on someone, and the cluster map."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Float, case, func, select, true
from sqlalchemy.orm import Session

from service.decisions import service as decisions
from service.decisions.schemas import DecisionOut
from service.models import Finding, Incident, Job, Node

SEVERITIES = ("critical", "major", "minor")
_SEVERITY_ORDER = case({s: i for i, s in enumerate(SEVERITIES)}, value=Incident.severity, else_=len(SEVERITIES))
# The ring on a tile: none below 0.3, then three steps up to a confident suspect.
_SCORE_STEPS = (0.3, 0.6, 0.85)


@dataclass
class OpenIncident:
    id: int
    job_id: str
    severity: str
    root_cause: str
    blame: str
    confidence: float
    summary: str | None
    suspects: list[str]
    opened_at: datetime
    updated_at: datetime


@dataclass
class Tile:
    name: str
    state: str
    score: float
    lemon: bool

    @property
    def ring(self) -> int:
        return sum(self.score >= step for step in _SCORE_STEPS)


@dataclass
class TileGroup:
    job_id: str | None  # None: nodes running no job
    tiles: list[Tile]
    states: Counter[str] = field(default_factory=Counter)

    @property
    def worst(self) -> float:
        return max((t.score for t in self.tiles), default=0.0)


@dataclass
class Overview:
    incidents: list[OpenIncident]
    incident_counts: dict[str, int]
    more_incidents: int
    waiting: list[DecisionOut]
    groups: list[TileGroup]
    node_states: Counter[str]
    node_count: int


def open_incidents(session: Session, *, limit: int) -> tuple[list[OpenIncident], dict[str, int], int]:
    """The most severe, then newest, open incidents; counts per severity over all of them."""
    counts = dict(
        session.execute(
            select(Incident.severity, func.count()).where(Incident.state != "resolved").group_by(Incident.severity)
        ).all()
    )
    rows = session.execute(
        select(Incident, Job.external_id)
        .join(Job, Job.id == Incident.job_id)
        .where(Incident.state != "resolved")
        .order_by(_SEVERITY_ORDER, Incident.id.desc())
        .limit(limit)
    ).all()
    items = [
        OpenIncident(
            id=i.id,
            job_id=job_id,
            severity=i.severity,
            root_cause=i.root_cause,
            blame=i.blame,
            confidence=i.confidence,
            summary=i.summary,
            suspects=[s["node"] for s in (i.suspects or [])[:3]],
            opened_at=i.opened_at,
            updated_at=i.updated_at,
        )
        for i, job_id in rows
    ]
    total = sum(counts.values())
    return items, {s: counts.get(s, 0) for s in SEVERITIES}, max(0, total - len(items))


def anomaly_scores(session: Session, *, now: datetime, window_s: float) -> dict[str, float]:
    """Each node's current anomaly score: how strongly an open incident accuses it, or a recent finding about it."""
    suspect = func.jsonb_array_elements(Incident.suspects).table_valued("value").alias("suspect")
    accused = session.execute(
        select(
            suspect.c.value.op("->>")("node").label("node"),
            func.max(suspect.c.value.op("->>")("confidence").cast(Float)),
        )
        .select_from(Incident)
        .join(suspect, true())
        .where(Incident.state != "resolved")
        .group_by("node")
    ).all()
    recent = session.execute(
        select(Node.name, func.max(Finding.confidence))
        .join(Node, Node.id == Finding.node_id)
        .where(Finding.created_at >= now - timedelta(seconds=window_s))
        .group_by(Node.name)
    ).all()
    scores: dict[str, float] = {}
    for name, score in [*accused, *recent]:
        if name is not None and score is not None:
            scores[name] = max(scores.get(name, 0.0), float(score))
    return scores


def cluster_map(session: Session, *, now: datetime, window_s: float) -> list[TileGroup]:
    """Every node as a tile, grouped by the job it runs; groups with the sickest node first."""
    scores = anomaly_scores(session, now=now, window_s=window_s)
    rows = session.execute(
        select(Node.name, Node.state, Node.lemon, Job.external_id)
        .outerjoin(Job, Job.id == Node.current_job_id)
        .order_by(Node.name)
    ).all()
    groups: dict[str | None, TileGroup] = defaultdict(lambda: TileGroup(job_id=None, tiles=[]))
    for name, state, lemon, job_id in rows:
        group = groups[job_id]
        group.job_id = job_id
        group.tiles.append(Tile(name=name, state=state, score=scores.get(name, 0.0), lemon=lemon))
        group.states[state] += 1
    return sorted(groups.values(), key=lambda g: (g.job_id is None, -g.worst, g.job_id or ""))


def overview(session: Session, *, now: datetime, window_s: float, incident_limit: int = 50) -> Overview:
    incidents, counts, more = open_incidents(session, limit=incident_limit)
    waiting = decisions.list_decisions(session, state=["awaiting_approval", "pending"], limit=50).items
    groups = cluster_map(session, now=now, window_s=window_s)
    states: Counter[str] = Counter()
    for group in groups:
        states.update(group.states)
    return Overview(
        incidents=incidents,
        incident_counts=counts,
        more_incidents=more,
        waiting=waiting,
        groups=groups,
        node_states=states,
        node_count=sum(states.values()),
    )
