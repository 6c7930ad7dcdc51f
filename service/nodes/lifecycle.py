"""Node lifecycle: healthy -> suspect -> cordoned | evicted -> in_repair -> returning -> healthy, every step a
node_events row naming its source (NODE_EVENT_SOURCES).

- diagnosis: an incident names a healthy node (suspect); it resolves without acting on it (healthy again).
- decision_ack: a scheduler acknowledges an eviction done (evicted, quarantined; a second eviction refreshes the
  state's time and reason, so the latest one is what the node shows).
- person: cordon, repair, return (with passing diagnostics or force: healthy at once; without: returning).
- scheduler: the adapter sees an out-of-service node schedulable again (returning).
- placement: a job's rank map or its agent's ranks put work on an out-of-service node (returning, shown loudly).
- checks: the return gate (the stop-time checks) passes (healthy) or fails (back out).

Every way into `returning` runs the return gate: the hooks registered with `on_gate` (service/checks/loop.py sends
the node's agent the stop-time checks) run in the same transaction. A node that keeps turning up as a suspect across
different jobs is a lemon: quarantined longer, and returned only with passing diagnostics (its gate's, or a
person's report).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.breaker.service import HELD as BREAKER_HELD
from service.breaker.service import RAIL as BREAKER_RAIL
from service.config import Settings
from service.errors import Conflict
from service.fleet import stages as repair_stages
from service.models import Decision, Finding, Incident, Node, NodeEvent
from service.nodes import ladder

SYSTEM_ACTOR = "faultline"
# States a node is out of service in (quarantined): a scheduler must not place work there, and it runs no job.
OUT_OF_SERVICE = ("cordoned", "evicted", "in_repair")
# Where each manual transition may start from.
CORDON_FROM = ("healthy", "suspect", "returning")
REPAIR_FROM = ("suspect", "cordoned", "evicted", "returning")
RETURN_FROM = ("suspect", "cordoned", "evicted", "in_repair", "returning")
# A node the scheduler has (or may have) put to work: only the checks that leave a job's ranks alone, forced past
# the agent's refusal to check a busy node. A node the scheduler still holds out (a person's return): the full
# level-2 suite first, and only a pass tells the scheduler to take it back.
IN_SERVICE_GATE_LEVEL = 1
DRAINED_GATE_LEVEL = 2
_GPU_IN_REASON = re.compile(r"\bGPU (\d+)\b")


@dataclass(frozen=True)
class Gate:
    """The return gate a node entering `returning` gets: the stop-time checks at `level`."""

    level: int
    force: bool  # it may run a job's ranks already: the agent checks anyway (level 1 leaves them alone)
    undrain: bool  # the scheduler still holds it out: a pass sends it a `return` decision
    reason: str


GateHook = Callable[[Session, Node, Gate, datetime], None]
_gate_hooks: list[GateHook] = []


def on_gate(hook: GateHook) -> GateHook:
    """Run `hook` whenever a node enters `returning`, in the same transaction (service/checks/loop.py registers the
    checks directive here: the checks domain builds on nodes, so nodes cannot call it); registering twice runs once."""
    if hook not in _gate_hooks:
        _gate_hooks.append(hook)
    return hook


def record(
    session: Session,
    *,
    node: Node,
    kind: str,
    source: str,
    actor: str,
    now: datetime,
    to_state: str | None = None,
    refresh: bool = False,
    reason: str | None = None,
    job_id: int | None = None,
    incident_id: int | None = None,
    decision_id: int | None = None,
    details: dict[str, Any] | None = None,
) -> NodeEvent:
    """Append to the node's history; with `to_state`, move the node there too (with `refresh`, also when it is there
    already: a second eviction's time and reason replace the first's)."""
    event = NodeEvent(
        node_id=node.id,
        job_id=job_id,
        incident_id=incident_id,
        decision_id=decision_id,
        at=now,
        kind=kind,
        from_state=node.state,
        to_state=to_state or node.state,
        actor=actor,
        source=source,
        reason=reason,
        details=details,
    )
    if to_state is not None and (to_state != node.state or refresh):
        node.state = to_state
        node.state_changed_at = now
        node.state_reason = reason
    if to_state is not None and to_state != "returning":
        node.work_before_gate_at = None  # shown only while its gate is pending
    if to_state in OUT_OF_SERVICE:
        # Out of service it runs no job: its agent's samples (a machine in repair still reporting its dead GPU's
        # climbing counters) are no longer the job's, which accused it again when it came back.
        node.current_job_id = None
    session.add(event)
    return event


def lock(session: Session, *, names: Iterable[str]) -> list[Node]:
    """The nodes, row-locked in name order so concurrent transitions neither race nor deadlock."""
    return list(session.scalars(select(Node).where(Node.name.in_(set(names))).order_by(Node.name).with_for_update()))


def returned_at(session: Session, *, names: Iterable[str]) -> dict[str, datetime]:
    """Node -> when it last came back from out of service (a scheduler's report, work placed on it, a person's
    return): what its evidence showed before then was the machine as it was before its repair."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    rows = session.execute(
        select(Node.name, func.max(NodeEvent.at))
        .join(NodeEvent, NodeEvent.node_id == Node.id)
        .where(
            Node.name.in_(wanted),
            NodeEvent.from_state.in_(OUT_OF_SERVICE),
            NodeEvent.to_state.is_not(None),
            NodeEvent.to_state.not_in(OUT_OF_SERVICE),
        )
        .group_by(Node.name)
    ).all()
    return {name: at for name, at in rows if at is not None}


def mark_suspects(
    session: Session, *, incident: Incident, names: Iterable[str], now: datetime, settings: Settings
) -> list[str]:
    """Healthy nodes an incident names become suspects; returns those that changed (a node out of service or in its
    return gate keeps its state, the accusation goes into its history).

    Runs on every diagnosis pass: nodes already marked for this incident are skipped before any row lock,
    so a long incident does not lock its nodes (which ingest updates) every few seconds.
    """
    marked = set(
        session.scalars(
            select(Node.name)
            .join(NodeEvent, NodeEvent.node_id == Node.id)
            .where(NodeEvent.incident_id == incident.id, NodeEvent.kind == "suspect")
        )
    )
    new = set(names) - marked
    changed: list[str] = []
    for node in lock(session, names=new) if new else []:
        to_state = "suspect" if node.state == "healthy" else None
        record(
            session,
            node=node,
            kind="suspect",
            source="diagnosis",
            actor=SYSTEM_ACTOR,
            now=now,
            to_state=to_state,
            reason=f"suspect in incident {incident.id}: {incident.summary or incident.root_cause}"[:500],
            job_id=incident.job_id,
            incident_id=incident.id,
        )
        session.flush()
        _check_lemon(session, node=node, now=now, settings=settings)
        if to_state:
            changed.append(node.name)
    return changed


def _check_lemon(session: Session, *, node: Node, now: datetime, settings: Settings) -> None:
    if node.lemon:
        return
    since = now - timedelta(days=settings.node_lemon_window_days)
    jobs = session.scalar(
        select(func.count(func.distinct(NodeEvent.job_id))).where(
            NodeEvent.node_id == node.id, NodeEvent.kind == "suspect", NodeEvent.at >= since
        )
    )
    if (jobs or 0) >= settings.node_lemon_jobs:
        node.lemon = True
        record(
            session,
            node=node,
            kind="lemon",
            source="diagnosis",
            actor=SYSTEM_ACTOR,
            now=now,
            reason=f"a suspect in {jobs} different jobs within {settings.node_lemon_window_days:g} days",
        )


def clear_suspects(session: Session, *, incident: Incident, now: datetime) -> list[str]:
    """When an incident resolves, its suspects that nothing else accuses are healthy again."""
    named = [s.get("node") for s in incident.suspects or [] if s.get("node")]
    cleared: list[str] = []
    for node in lock(session, names=named):
        if node.state != "suspect":
            continue
        other = session.scalar(
            select(Incident.id).where(
                Incident.id != incident.id,
                Incident.state != "resolved",
                Incident.suspects.contains([{"node": node.name}]),
            )
        )
        if other is None:
            record(
                session,
                node=node,
                kind="cleared",
                source="diagnosis",
                actor=SYSTEM_ACTOR,
                now=now,
                to_state="healthy",
                reason=f"incident {incident.id} resolved without action on this node",
                job_id=incident.job_id,
                incident_id=incident.id,
            )
            cleared.append(node.name)
    return cleared


def on_acknowledged(session: Session, *, decision: Decision, node: Node, now: datetime, settings: Settings) -> None:
    """A scheduler reported what it did with a node decision: record it, and move the node if it acted."""
    to_state, details = None, None
    reason = decision.outcome_message or decision.reason
    if decision.state == "done" and decision.kind == "evict":
        to_state = "evicted"
        quarantine = settings.node_lemon_quarantine_s if node.lemon else settings.node_quarantine_s
        node.quarantined_until = max(node.quarantined_until or now, now + timedelta(seconds=quarantine))
        # The state shows why it is out (the decision's reason, its GPU); what the scheduler did is in the details.
        reason = decision.reason
        details = {"gpus": _evicted_gpus(session, decision), "scheduler": decision.outcome_message}
        ladder.mark_rma(node, decision=decision, now=now)  # the ladder's top rung: out for a vendor replacement
    elif decision.state == "done" and decision.kind == "cordon" and node.state in CORDON_FROM and _held(decision):
        # A shared cause's cordon the fleet breaker held left its node in service; a person let it go, it is done.
        to_state = "cordoned"
    record(
        session,
        node=node,
        kind=f"{decision.kind}_{decision.state}",
        source="decision_ack",
        actor=decision.actor or SYSTEM_ACTOR,
        now=now,
        to_state=to_state,
        refresh=to_state == "evicted",
        reason=reason,
        job_id=decision.job_id,
        incident_id=decision.incident_id,
        decision_id=decision.id,
        details=details,
    )


def _held(decision: Decision) -> bool:
    """Whether the fleet breaker held the decision for a person (service/breaker/: its guard rail says so)."""
    rail = ((decision.evidence or {}).get("guard_rails") or {}).get(BREAKER_RAIL)
    return isinstance(rail, str) and rail.startswith(BREAKER_HELD)


def _evicted_gpus(session: Session, decision: Decision) -> list[int]:
    """The GPUs an eviction is about: its findings' GPU subjects on the node, else those its reason names."""
    if decision.gpu is not None:
        return [decision.gpu]
    ids = [f["id"] for f in (decision.evidence or {}).get("findings", []) if isinstance(f, dict) and "id" in f]
    subjects = session.scalars(
        select(Finding.subject).where(
            Finding.id.in_(ids), Finding.subject_kind == "gpu", Finding.node_id == decision.node_id
        )
    ).all()
    gpus = {int(s.rsplit("/", 1)[1]) for s in subjects if "/" in s and s.rsplit("/", 1)[1].isdigit()}
    return sorted(gpus or {int(g) for g in _GPU_IN_REASON.findall(decision.reason or "")})


def cordon(session: Session, *, node: Node, reason: str, actor: str, now: datetime) -> bool:
    """A person takes the node out of service; False when it already is."""
    if node.state == "cordoned":
        return False
    if node.state not in CORDON_FROM:
        raise Conflict(f"node {node.name} is {node.state}: it is already out of service")
    record(session, node=node, kind="cordon", source="person", actor=actor, now=now, to_state="cordoned", reason=reason)
    return True


def repair(session: Session, *, node: Node, reason: str, actor: str, now: datetime) -> bool:
    """The node went to repair; False when it already is."""
    if node.state == "in_repair":
        return False
    if node.state not in REPAIR_FROM:
        raise Conflict(
            f"node {node.name} is {node.state}; only a suspect or out-of-service node goes to repair (or one returning)"
        )
    record(
        session, node=node, kind="repair", source="person", actor=actor, now=now, to_state="in_repair", reason=reason
    )
    return True


def return_to_service(
    session: Session,
    *,
    node: Node,
    reason: str,
    actor: str,
    diagnostics: dict[str, Any] | None,
    force: bool,
    now: datetime,
    settings: Settings,
    source: str = "person",
) -> str | None:
    """A person (or a diagnose decision's checks) returns the node: with passing diagnostics or `force` it is healthy
    at once; without, an out-of-service node is `returning` while its gate runs. The state it went to, or None when
    nothing changed (healthy already, or already waiting for its gate)."""
    if node.state == "healthy":
        return None
    if node.state not in RETURN_FROM:
        raise Conflict(f"node {node.name} is {node.state} and cannot be returned")
    if diagnostics is not None and not diagnostics.get("passed"):
        raise Conflict(f"node {node.name} failed its diagnostics: it stays out of service")
    vouched = force or diagnostics is not None
    if node.state == "returning" and not vouched:
        return None
    # The quarantine holds a node out; one the scheduler put back already (returning) is past it.
    if not force and node.state != "returning":
        if node.quarantined_until is not None and node.quarantined_until > now:
            why = "a lemon (a suspect in several jobs)" if node.lemon else "evicted"
            raise Conflict(
                f"node {node.name} is {why} and quarantined until {node.quarantined_until.isoformat()}; "
                "pass force=true to override (recorded in its history)"
            )
        needs_report = node.lemon or settings.node_return_requires_diagnostics
        if node.state == "suspect" and diagnostics is None and needs_report:
            why = "it is a lemon" if node.lemon else "this service requires it"
            raise Conflict(f"node {node.name} needs a passing diagnostics report to return ({why})")
    if not vouched and node.state in OUT_OF_SERVICE:
        gate = Gate(DRAINED_GATE_LEVEL, force=False, undrain=True, reason=f"return by {actor}: {reason}")
        enter_returning(
            session, node=node, kind="return", source=source, actor=actor, reason=reason, gate=gate, now=now
        )
        return "returning"
    repair_stages.node_returning(session, node=node, now=now)
    record(
        session,
        node=node,
        kind="return_forced" if force else "return",
        source=source,
        actor=actor,
        now=now,
        to_state="healthy",
        reason=reason,
        details={"diagnostics": diagnostics} if diagnostics is not None else None,
    )
    node.quarantined_until = None
    return "healthy"


def enter_returning(
    session: Session,
    *,
    node: Node,
    kind: str,
    source: str,
    actor: str,
    reason: str,
    gate: Gate,
    now: datetime,
    job_id: int | None = None,
    details: dict[str, Any] | None = None,
) -> NodeEvent:
    """Into `returning`, and its gate asked for (the `on_gate` hooks)."""
    repair_stages.node_returning(session, node=node, now=now)
    event = record(
        session,
        node=node,
        kind=kind,
        source=source,
        actor=actor,
        now=now,
        to_state="returning",
        reason=reason,
        job_id=job_id,
        details={**(details or {}), "gate": {"level": gate.level, "force": gate.force, "undrain": gate.undrain}},
    )
    session.flush()
    for hook in _gate_hooks:
        hook(session, node, gate, now)
    return event


def gate_passed(
    session: Session, *, node: Node, diagnostics: dict[str, Any], actor: str, reason: str, now: datetime
) -> bool:
    """Its return gate passed: healthy (a suspect, if an open incident accused it meanwhile), its quarantine over.
    False when it was not waiting for its gate."""
    if node.state != "returning":
        return False
    accused = session.scalar(
        select(Incident.id).where(Incident.state != "resolved", Incident.suspects.contains([{"node": node.name}]))
    )
    record(
        session,
        node=node,
        kind="gate_passed",
        source="checks",
        actor=actor,
        now=now,
        to_state="healthy" if accused is None else "suspect",
        reason=reason if accused is None else f"{reason}; incident {accused} accuses it",
        details={"diagnostics": diagnostics},
    )
    node.quarantined_until = None
    return True


def gate_failed(
    session: Session, *, node: Node, undrain: bool, actor: str, reason: str, details: dict[str, Any], now: datetime
) -> str | None:
    """Its return gate found a fault. A node the scheduler still holds out goes back to the state it was returned
    from; one the scheduler put back stays `returning` (it runs work) until the eviction the caller asks for is
    acknowledged. The state it is in after, or None when it was not waiting for its gate."""
    if node.state != "returning":
        return None
    back = None
    if undrain:
        back = (
            session.scalar(
                select(NodeEvent.from_state)
                .where(
                    NodeEvent.node_id == node.id,
                    NodeEvent.to_state == "returning",
                    NodeEvent.from_state.in_(OUT_OF_SERVICE),
                )
                .order_by(NodeEvent.at.desc(), NodeEvent.id.desc())
                .limit(1)
            )
            or "in_repair"
        )
    record(
        session,
        node=node,
        kind="gate_failed",
        source="checks",
        actor=actor,
        now=now,
        to_state=back,
        reason=reason,
        details=details,
    )
    return node.state
