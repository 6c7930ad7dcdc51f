"""The overview: open incidents by severity, decisions waiting on someone, and the cluster map."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from service.decisions import service as decisions
from service.decisions.schemas import DecisionOut
from service.incidents import service as incidents
from service.nodes import service as nodes

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
    counts = incidents.open_counts(session)
    rows = incidents.most_severe_open(session, limit=limit)
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
    return items, {s: counts.get(s, 0) for s in incidents.SEVERITIES}, max(0, total - len(items))


def cluster_map(session: Session, *, now: datetime, window_s: float) -> list[TileGroup]:
    """Every node as a tile, grouped by the job it runs; groups with the sickest node first."""
    scores = incidents.anomaly_scores(session, now=now, window_s=window_s)
    rows = nodes.states_and_jobs(session)
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
