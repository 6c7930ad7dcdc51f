"""Node lifecycle: healthy -> suspect -> cordoned/evicted -> in_repair -> returned, every step recorded.

Transitions are made by diagnosis (suspect, back to healthy), by schedulers acknowledging decisions
(evicted) and by people (cordon, repair, return). A node that keeps turning up as a suspect across
different jobs is a lemon: quarantined longer, and returned only with passing diagnostics.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import Conflict
from service.fleet import stages as repair_stages
from service.models import Decision, Incident, Node, NodeEvent

SYSTEM_ACTOR = "faultline"
# States a node is out of service in: a scheduler must not place work there, and it runs no job.
OUT_OF_SERVICE = ("cordoned", "evicted", "in_repair")
# Where each manual transition may start from.
CORDON_FROM = ("healthy", "suspect", "returned")
REPAIR_FROM = ("suspect", "cordoned", "evicted")
RETURN_FROM = ("suspect", "cordoned", "evicted", "in_repair")


def record(
    session: Session,
    *,
    node: Node,
    kind: str,
    actor: str,
    now: datetime,
    to_state: str | None = None,
    reason: str | None = None,
    job_id: int | None = None,
    incident_id: int | None = None,
    decision_id: int | None = None,
    details: dict[str, Any] | None = None,
) -> NodeEvent:
    """Append to the node's history; with `to_state`, move the node there too."""
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
        reason=reason,
        details=details,
    )
    if to_state is not None and to_state != node.state:
        node.state = to_state
        node.state_changed_at = now
        node.state_reason = reason
    if to_state in OUT_OF_SERVICE:
        # Out of service it runs no job: its agent's samples (a machine in repair still reporting its dead GPU's
        # climbing counters) are no longer the job's, which accused it again when it came back.
        node.current_job_id = None
    session.add(event)
    return event


def lock(session: Session, *, names: Iterable[str]) -> list[Node]:
    """The nodes, row-locked in name order so concurrent transitions neither race nor deadlock."""
    return list(session.scalars(select(Node).where(Node.name.in_(set(names))).order_by(Node.name).with_for_update()))


def mark_suspects(
    session: Session, *, incident: Incident, names: Iterable[str], now: datetime, settings: Settings
) -> list[str]:
    """Healthy (or returned) nodes an incident names become suspects; returns those that changed.

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
        to_state = "suspect" if node.state in ("healthy", "returned") else None
        record(
            session,
            node=node,
            kind="suspect",
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
    to_state = None
    if decision.state == "done" and decision.kind == "evict":
        to_state = "evicted"
        quarantine = settings.node_lemon_quarantine_s if node.lemon else settings.node_quarantine_s
        node.quarantined_until = max(node.quarantined_until or now, now + timedelta(seconds=quarantine))
    record(
        session,
        node=node,
        kind=f"{decision.kind}_{decision.state}",
        actor=decision.actor or SYSTEM_ACTOR,
        now=now,
        to_state=to_state,
        reason=decision.outcome_message or decision.reason,
        job_id=decision.job_id,
        incident_id=decision.incident_id,
        decision_id=decision.id,
    )


def cordon(session: Session, *, node: Node, reason: str, actor: str, now: datetime) -> bool:
    """A person takes the node out of service; False when it already is."""
    if node.state == "cordoned":
        return False
    if node.state not in CORDON_FROM:
        raise Conflict(f"node {node.name} is {node.state}: it is already out of service")
    record(session, node=node, kind="cordon", actor=actor, now=now, to_state="cordoned", reason=reason)
    return True


def repair(session: Session, *, node: Node, reason: str, actor: str, now: datetime) -> bool:
    """The node went to repair; False when it already is."""
    if node.state == "in_repair":
        return False
    if node.state not in REPAIR_FROM:
        raise Conflict(f"node {node.name} is {node.state}; only a suspect or out-of-service node goes to repair")
    record(session, node=node, kind="repair", actor=actor, now=now, to_state="in_repair", reason=reason)
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
) -> bool:
    """Back to service, if quarantine and diagnostics allow; False when it already is."""
    if node.state in ("healthy", "returned"):
        return False
    if node.state not in RETURN_FROM:
        raise Conflict(f"node {node.name} is {node.state} and cannot be returned")
    if diagnostics is not None and not diagnostics.get("passed"):
        raise Conflict(f"node {node.name} failed its diagnostics: it stays out of service")
    if not force:
        if node.quarantined_until is not None and node.quarantined_until > now:
            why = "a lemon (a suspect in several jobs)" if node.lemon else "evicted"
            raise Conflict(
                f"node {node.name} is {why} and quarantined until {node.quarantined_until.isoformat()}; "
                "pass force=true to override (recorded in its history)"
            )
        if (node.lemon or settings.node_return_requires_diagnostics) and diagnostics is None:
            why = "it is a lemon" if node.lemon else "this service requires it"
            raise Conflict(f"node {node.name} needs a passing diagnostics report to return ({why})")
    repair_stages.node_returning(session, node=node, now=now)
    record(
        session,
        node=node,
        kind="return_forced" if force else "return",
        actor=actor,
        now=now,
        to_state="returned",
        reason=reason,
        details={"diagnostics": diagnostics} if diagnostics is not None else None,
    )
    node.quarantined_until = None
    return True
