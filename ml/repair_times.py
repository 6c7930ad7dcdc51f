"""Repair times of incidents: how long each stage of detect, decide, act and return took, and p50/p90 over many.

Stages of one incident, each from the end of the one before it:

- detect: from the earliest fault evidence (the first finding's `observed_at`) to the incident's opening;
- decide: from the opening to its first decision (any kind or state: a shadow decision was still decided);
- act: from the decision a scheduler acknowledged first (as done or failed) to that acknowledgement;
- return: from a node's eviction or cordon for this incident to its return to service (per node: an incident
  that evicted two nodes has two return samples; the incident's own value is its last node back).

A stage that has not happened yet (no decision, no ack, a node still out) has no value: it is left out of the
percentiles rather than counted as zero. Negative spans (an agent clock ahead of the service's) count as zero.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

STAGES = ("detect", "decide", "act", "return")
GROUPINGS = ("fleet", "node", "root_cause")
# Acknowledgements in which a scheduler acted (or tried to); an expiry or a person's rejection is no action.
ACTED = ("done", "failed")
# A node is back in service once it reaches one of these.
BACK = ("returning", "healthy", "returned")  # returned: the state before returning replaced it (old history)


@dataclass(frozen=True)
class DecisionRow:
    node: str | None
    state: str
    created_at: datetime
    acked_at: datetime | None


@dataclass(frozen=True)
class Outage:
    """A node taken out of service for an incident, and when it came back (None: still out)."""

    node: str
    out_at: datetime
    back_at: datetime | None

    @property
    def seconds(self) -> float | None:
        return _span(self.out_at, self.back_at)


@dataclass(frozen=True)
class IncidentTimes:
    incident_id: int
    root_cause: str
    opened_at: datetime
    # Nodes its decisions named: the incident counts for each of them when grouped by node.
    nodes: tuple[str, ...]
    detect_s: float | None
    decide_s: float | None
    act_s: float | None
    outages: tuple[Outage, ...] = ()

    @property
    def return_s(self) -> float | None:
        """The last node's time out of service; None while any is still out (or none was taken out)."""
        spans = [o.seconds for o in self.outages]
        if not spans or any(s is None for s in spans):
            return None
        return max(s for s in spans if s is not None)

    def stage(self, name: str) -> float | None:
        return {"detect": self.detect_s, "decide": self.decide_s, "act": self.act_s, "return": self.return_s}[name]


def _span(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def incident_times(
    *,
    incident_id: int,
    root_cause: str,
    opened_at: datetime,
    evidence_at: datetime | None,
    decisions: Sequence[DecisionRow],
    outs: Iterable[tuple[str, datetime]],
    backs: dict[str, Sequence[datetime]],
) -> IncidentTimes:
    """One incident's stages from its rows: `outs` are (node, evicted or cordoned at) for this incident, `backs`
    every time each of those nodes came back to service, in any order."""
    first = min((d.created_at for d in decisions), default=None)
    acked = sorted((d.acked_at, d.created_at) for d in decisions if d.state in ACTED and d.acked_at is not None)
    outages = []
    for node, out_at in sorted(outs, key=lambda o: (o[1], o[0])):
        back = min((t for t in backs.get(node, ()) if t >= out_at), default=None)
        outages.append(Outage(node=node, out_at=out_at, back_at=back))
    return IncidentTimes(
        incident_id=incident_id,
        root_cause=root_cause,
        opened_at=opened_at,
        nodes=tuple(sorted({d.node for d in decisions if d.node} | {o.node for o in outages})),
        detect_s=_span(evidence_at, opened_at),
        decide_s=_span(opened_at, first),
        act_s=_span(acked[0][1], acked[0][0]) if acked else None,
        outages=tuple(outages),
    )


@dataclass(frozen=True)
class StageSummary:
    count: int
    p50: float | None
    p90: float | None
    max: float | None


def summarize(samples: Iterable[float]) -> StageSummary:
    """Count, p50, p90 (linear interpolation between the closest ranks, numpy's default) and max."""
    values = np.asarray(list(samples), dtype=float)
    if values.size == 0:
        return StageSummary(count=0, p50=None, p90=None, max=None)
    p50, p90 = np.percentile(values, [50, 90])
    return StageSummary(count=int(values.size), p50=float(p50), p90=float(p90), max=float(values.max()))


@dataclass
class Group:
    key: str
    incidents: int = 0
    stages: dict[str, StageSummary] = field(default_factory=dict)


def aggregate(times: Iterable[IncidentTimes], *, by: str) -> list[Group]:
    """Stage summaries per group: one group `fleet`, or per root cause, or per node (an incident counts for every
    node its decisions named; the return samples of a node are only its own outages).

    Node groups come slowest first: longest p90 out of service, then longest p90 to act; others by key.
    """
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(GROUPINGS)}, not {by!r}")
    samples: dict[str, dict[str, list[float]]] = defaultdict(lambda: {s: [] for s in STAGES})
    counts: dict[str, int] = defaultdict(int)
    for t in times:
        keys = ["fleet"] if by == "fleet" else [t.root_cause] if by == "root_cause" else list(t.nodes)
        for key in keys:
            counts[key] += 1
            for stage in ("detect", "decide", "act"):
                value = t.stage(stage)
                if value is not None:
                    samples[key][stage].append(value)
            for o in t.outages:
                if o.seconds is not None and (by != "node" or o.node == key):
                    samples[key]["return"].append(o.seconds)
    groups = [
        Group(key=k, incidents=counts[k], stages={s: summarize(samples[k][s]) for s in STAGES}) for k in sorted(counts)
    ]
    if by == "node":
        groups.sort(key=lambda g: (-_or_below(g.stages["return"].p90), -_or_below(g.stages["act"].p90), g.key))
    return groups


def _or_below(value: float | None) -> float:
    """For sorting slowest first: a stage without samples sorts after every measured one, zero included."""
    return -1.0 if value is None else value
