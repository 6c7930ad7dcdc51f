"""The overview, for someone woken at 3 a.m.: what happened lately (incidents of the last hours, resolved ones
included, with their outcome), jobs not getting anywhere, nodes waiting on a person, decisions waiting on someone,
and the cluster map. Everything comes from the domains' service functions; this only arranges it."""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.decisions import service as decisions
from service.decisions.schemas import DecisionOut
from service.incidents import recent as recent_incidents
from service.incidents import service as incidents
from service.jobs import progress
from service.nodes import attention
from service.nodes import service as nodes
from service.unknown_lines import service as unknown_lines

# The ring on a tile: none below 0.3, then three steps up to a confident suspect.
_SCORE_STEPS = (0.3, 0.6, 0.85)


# The order nodes needing attention are listed in: the ones a person acts on first.
_STATE_ORDER = {"suspect": 0, "evicted": 1, "cordoned": 2, "in_repair": 3, "returning": 4, "healthy": 5}


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
    job_id: str | None  # None: nodes running no job (or, grouped by rack or switch, no such label)
    tiles: list[Tile]
    states: Counter[str] = field(default_factory=Counter)
    label: str | None = None  # the rack's or switch's name when grouped by one

    @property
    def short_names(self) -> list[tuple[Tile, str]]:
        """Each tile with the part of its name that tells it from the group's others (the shared prefix cut)."""
        names = [t.name for t in self.tiles]
        cut = len(os.path.commonprefix(names)) if len(names) > 1 else 0  # noqa: RUF071 (characters, on purpose)
        # Keep a whole trailing number: "node-0017" and "node-0018" read as "0017", "0018", not "7", "8".
        while cut and names[0][cut - 1].isdigit():
            cut -= 1
        return [(t, t.name[cut:] or t.name) for t in self.tiles]

    @property
    def worst(self) -> float:
        return max((t.score for t in self.tiles), default=0.0)


@dataclass
class Overview:
    incident_counts: dict[str, int]  # open incidents by severity
    recent: list[recent_incidents.RecentIncident]  # open now, or opened or resolved within recent_hours
    more_recent: int
    recent_hours: float
    stalled: list[progress.StalledJob]  # no net progress for longer than no_progress_s
    no_progress_s: float
    needs: list[attention.NodeNeed]  # nodes waiting on a person
    more_needs: int
    state_counts: dict[str, int]  # every node state's count: the node list's own filter
    waiting: list[DecisionOut]
    groups: list[TileGroup]
    node_states: Counter[str]
    node_count: int
    attention: list[Tile]  # ringed (accused) nodes first, then every node not healthy: findable at a glance
    group_by: str  # job, rack or switch
    groupings: list[str]  # those the inventory allows: job always; rack, switch where some node is labelled
    unknown: unknown_lines.Summary  # error-looking lines no rule knows, of the last UNKNOWN_HOURS: new messages


# The overview's count of unknown lines looks back this far (the /unknown-lines page's default window).
UNKNOWN_HOURS = 24


# Node labels that name where a machine sits, by the grouping they serve.
LOCATION_LABELS = {"rack": ("rack", "topology.kubernetes.io/rack"), "switch": ("switch", "leaf_switch", "tor")}


def _location(labels: dict[str, Any] | None, by: str) -> str | None:
    for key in LOCATION_LABELS.get(by, ()):
        if labels and labels.get(key) not in (None, ""):
            return str(labels[key])
    return None


def cluster_map(
    session: Session, *, now: datetime, window_s: float, by: str = "job"
) -> tuple[list[TileGroup], list[str]]:
    """Every node as a tile, grouped by the job it runs (or its rack or switch); groups with the sickest node first.
    Also the groupings the inventory allows."""
    scores = incidents.anomaly_scores(session, now=now, window_s=window_s)
    rows = nodes.states_and_jobs(session)
    groupings = ["job"] + [g for g in LOCATION_LABELS if any(_location(r[4], g) for r in rows)]
    groups: dict[str | None, TileGroup] = defaultdict(lambda: TileGroup(job_id=None, tiles=[]))
    for name, state, lemon, job_id, labels in rows:
        key = job_id if by == "job" else _location(labels, by)
        group = groups[key]
        group.job_id = job_id if by == "job" else None
        group.label = None if by == "job" else key
        group.tiles.append(Tile(name=name, state=state, score=scores.get(name, 0.0), lemon=lemon))
        group.states[state] += 1
    ordered = sorted(
        groups.values(), key=lambda g: (g.job_id is None and g.label is None, -g.worst, g.job_id or g.label or "")
    )
    return ordered, groupings


def overview(
    session: Session,
    *,
    now: datetime,
    window_s: float,
    recent_hours: float = 6.0,
    no_progress_s: float = 600.0,
    incident_limit: int = 50,
    group_by: str = "job",
) -> Overview:
    counts = incidents.open_counts(session)
    recent, more_recent = recent_incidents.recent(
        session, since=now - timedelta(hours=recent_hours), limit=incident_limit
    )
    needs, needs_total = attention.needing_a_person(session)
    waiting = decisions.list_decisions(session, state=["awaiting_approval", "pending"], limit=50).items
    groups, groupings = cluster_map(session, now=now, window_s=window_s, by=group_by)
    # The node list's own counts (its state filter), not the map's: the two pages agree by construction.
    counted = attention.state_counts(session)
    state_counts = {s: counted[s] for s in sorted(counted, key=lambda s: (_STATE_ORDER.get(s, 9), s))}
    return Overview(
        incident_counts={s: counts.get(s, 0) for s in incidents.SEVERITIES},
        recent=recent,
        more_recent=more_recent,
        recent_hours=recent_hours,
        stalled=progress.stalled(session, now=now, after_s=no_progress_s),
        no_progress_s=no_progress_s,
        needs=needs,
        more_needs=max(0, needs_total - len(needs)),
        state_counts=state_counts,
        waiting=waiting,
        groups=groups,
        node_states=Counter(state_counts),
        node_count=sum(state_counts.values()),
        attention=sorted(
            (t for g in groups for t in g.tiles if t.state != "healthy" or t.ring),
            key=lambda t: (-t.ring, _STATE_ORDER.get(t.state, 9), -t.score, t.name),
        ),
        group_by=group_by if group_by in groupings else "job",
        groupings=groupings,
        unknown=unknown_lines.summary(session, since=now - timedelta(hours=UNKNOWN_HOURS)),
    )
