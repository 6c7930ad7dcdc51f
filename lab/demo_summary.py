"""What a demo run did, in numbers: the faults the simulator injected (its ground truth), the decisions the
service made on them, which of those hit the faulty node and which accused a healthy one, the job's restarts on
spares, the incidents still open, and the job's ETTR.

`summarize` is pure (ground truth and rows in, a dict out); `read_summary` reads the rows from the database;
`format_summary` prints it. `faultline demo --duration 30m` prints one at the end.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.jobs import ettr
from service.models import Decision, Incident, Job, Node

# A decision this long after its fault's machine was repaired (or before the fault) still counts as about it:
# detection lags the evidence, and the evidence of a repaired fault reaches the service a little late.
GRACE = timedelta(seconds=60)
NODE_ACTIONS = frozenset({"evict", "diagnose", "reset_gpu", "cordon"})


@dataclass(frozen=True)
class DecisionRow:
    id: int
    kind: str
    node: str | None
    state: str
    created_at: datetime


def _at(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def summarize(
    ground_truth: dict[str, Any],
    decisions: list[DecisionRow],
    *,
    open_incidents: int,
    incidents: int,
    ettr_ratio: float | None,
    now: datetime,
) -> dict[str, Any]:
    """The run's numbers. A fault's window on its node: from its injection to its repair (or now), with GRACE."""
    faults = ground_truth.get("faults", [])
    spans: list[tuple[datetime, datetime]] = []
    for f in faults:
        start = _at(f["injected_at"])
        assert start is not None
        spans.append((start - GRACE, (_at(f.get("repaired_at")) or now) + GRACE))

    def hits(d: DecisionRow, i: int) -> bool:
        return d.node in faults[i]["nodes"] and spans[i][0] <= d.created_at <= spans[i][1]

    on_nodes = [d for d in decisions if d.kind in NODE_ACTIONS and d.node]
    false = [d for d in on_nodes if not any(hits(d, i) for i in range(len(faults)))]
    evicted_faulty = {i for d in on_nodes if d.kind == "evict" for i in range(len(faults)) if hits(d, i)}
    loop = ground_truth.get("loop", [])
    by_fault = Counter(f.get("resolved_by") or ("plan repair" if f.get("repaired_at") else "open") for f in faults)
    return {
        "faults": len(faults),
        "fault_kinds": dict(Counter(f["kind"] for f in faults)),
        "faults_resolved_by": dict(by_fault),
        "faults_expecting_eviction": sum(1 for f in faults if f.get("expect_action") == "evict"),
        "faults_evicted": len(evicted_faulty),
        "decisions": dict(Counter(d.kind for d in decisions)),
        "decision_states": dict(Counter(d.state for d in decisions)),
        "false_accusations": len(false),
        "false_accusation_details": [f"#{d.id} {d.kind} {d.node} at {d.created_at.isoformat()}" for d in false],
        "restarts_on_spares": sum(1 for e in loop if e["kind"] == "swap_in"),
        "repairs_completed": sum(1 for e in loop if e["kind"] == "to_pool"),
        "incidents": incidents,
        "incidents_open": open_incidents,
        "ettr": ettr_ratio,
    }


def read_summary(session: Session, *, ground_truth: dict[str, Any], job_id: str, now: datetime) -> dict[str, Any]:
    """The summary from the database: every decision since the run started (the demo's service is its own)."""
    started = _at(ground_truth.get("started_at")) or now
    rows = session.execute(
        select(Decision.id, Decision.kind, Node.name, Decision.state, Decision.created_at)
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(Decision.created_at >= started)
        .order_by(Decision.id)
    ).all()
    decisions = [DecisionRow(*row) for row in rows]
    job = session.scalar(select(Job).where(Job.external_id == job_id))
    incidents, open_incidents, ratio = 0, 0, None
    if job is not None:
        states = session.scalars(select(Incident.state).where(Incident.job_id == job.id)).all()
        incidents, open_incidents = len(states), sum(1 for s in states if s != "resolved")
        ratio = ettr.job_ettr(session, job=job, now=now).cumulative.ratio
    return summarize(
        ground_truth, decisions, open_incidents=open_incidents, incidents=incidents, ettr_ratio=ratio, now=now
    )


def format_summary(s: dict[str, Any]) -> str:
    def kv(d: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"

    ratio = "n/a" if s["ettr"] is None else f"{s['ettr']:.3f}"
    lines = [
        f"  faults injected        {s['faults']} ({kv(s['fault_kinds'])})",
        f"  faults taken out by    {kv(s['faults_resolved_by'])}",
        f"  evictions of the faulty node  {s['faults_evicted']} of {s['faults_expecting_eviction']} faults "
        "that call for one",
        f"  decisions              {kv(s['decisions'])} (states: {kv(s['decision_states'])})",
        f"  false accusations      {s['false_accusations']} (decisions on a node outside its faults' windows)",
        *(f"                         {d}" for d in s["false_accusation_details"]),
        f"  restarts on spares     {s['restarts_on_spares']}, repairs completed {s['repairs_completed']}",
        f"  incidents              {s['incidents']}, still open {s['incidents_open']}",
        f"  job ETTR               {ratio}",
    ]
    return "\n".join(lines)
