"""A node coming back into service, as the real world brings it: a scheduler reports it schedulable again, a job
places work on it while faultline still holds it out (before its return gate), and its gate's verdict.

The scheduler has the last word on where work runs: faultline never keeps a node `evicted` that runs a job's ranks.
A reported return is ordinary (the node is `returning` and its agent runs the stop-time checks); work placed on a
quarantined node before anyone reported it back is shown loudly (the node's `work_before_gate_at`, `before_gate`,
one chat alert per occurrence), and the same gate runs. The gate's verdict: a pass makes the node healthy; a
failure takes it out again (an `evict` decision where the scheduler has it in service).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.breaker import service as breaker
from service.config import Settings
from service.errors import Conflict
from service.models import Decision, Job, Node, NodeEvent, ProcessSnapshot
from service.nodes import lifecycle
from service.nodes.lifecycle import IN_SERVICE_GATE_LEVEL, OUT_OF_SERVICE, Gate
from service.nodes.schemas import NodeDetail
from service.nodes.service import describe, get_by_name, tell_schedulers
from service.notify import service as notify
from service.silences import service as silences

log = logging.getLogger(__name__)

# Decisions that take a node out and that its scheduler has not acted on: until it has, its report that the node is
# schedulable describes the moment before, not a return.
_TAKE_OUT = ("evict", "cordon", "reset_gpu", "diagnose")
_OPEN = ("pending", "awaiting_approval")
# Processes a node ran up to this long before it went out are its old work (dying ranks, or a Slurm drain letting a
# job finish), not new work placed on it.
_OLD_WORK = timedelta(hours=1)
GATE_EVICT_CONFIDENCE = 0.9  # a measured failure of the node's own checks, as for a diagnose decision's


@dataclass(frozen=True)
class BeforeGate:
    """A node running work that a scheduler placed on it while faultline held it out, before its gate passed."""

    node: str
    since: datetime
    job: str | None
    was: str | None  # the state it was in when the work was placed: evicted, cordoned, in_repair
    reason: str | None


def report_return(session: Session, *, name: str, reason: str, actor: str, now: datetime) -> NodeDetail:
    """A scheduler put the node back in service: `returning`, its gate asked for. A node faultline holds in service
    already changes nothing; one with a take-out decision its scheduler has not acted on is a 409."""
    node = get_by_name(session, name=name, lock=True)
    if node.state in OUT_OF_SERVICE:
        waiting = session.execute(
            select(Decision.id, Decision.kind)
            .where(Decision.node_id == node.id, Decision.kind.in_(_TAKE_OUT), Decision.state.in_(_OPEN))
            .order_by(Decision.id)
            .limit(1)
        ).first()
        if waiting is not None:
            raise Conflict(
                f"node {name} has {waiting.kind} decision {waiting.id} waiting: act on it before reporting the node "
                "back in service"
            )
        early = node.quarantined_until is not None and node.quarantined_until > now
        note = f" (before its quarantine ended, {node.quarantined_until.isoformat()})" if early else ""  # type: ignore[union-attr]
        gate = Gate(IN_SERVICE_GATE_LEVEL, force=True, undrain=False, reason=f"returned by {actor}: {reason}"[:1000])
        lifecycle.enter_returning(
            session,
            node=node,
            kind="return_reported",
            source="scheduler",
            actor=actor,
            reason=f"{reason}{note}"[:1000],
            gate=gate,
            now=now,
        )
    session.flush()
    return describe(session, name=name)


def placed_before_gate(session: Session, *, node: Node, job_id: int, job: str, how: str, now: datetime) -> bool:
    """Work placed on a node faultline holds out of service: `returning`, marked, its gate asked for, one chat alert.
    The node's row must be locked by the caller. False when the node is not out of service."""
    if node.state not in OUT_OF_SERVICE:
        return False
    was = node.state
    reason = f"placed in job {job} while {was.replace('_', ' ')}, before its return gate: {how}"[:1000]
    event = lifecycle.enter_returning(
        session,
        node=node,
        kind="placed_before_gate",
        source="placement",
        actor=lifecycle.SYSTEM_ACTOR,
        reason=reason,
        gate=Gate(IN_SERVICE_GATE_LEVEL, force=True, undrain=False, reason=reason),
        now=now,
        job_id=job_id,
        details={"was": was, "how": how},
    )
    node.work_before_gate_at = now
    node.current_job_id = job_id
    log.warning("node %s: %s", node.name, reason)
    if silences.covering(silences.active_silences(session, now=now), job=job, nodes=[node.name]) is None:
        notify.record_node_event(
            session,
            node=node,
            event="node_before_gate",
            key=str(event.id),
            payload={
                "title": f"{node.name} runs job {job} before its return gate (it was {was.replace('_', ' ')})",
                "summary": f"{reason}. faultline now runs its stop-time checks and takes it out again if they fail.",
                "job": job,
                "was": was,
            },
            now=now,
        )
    return True


def placed_by_registration(
    session: Session, *, job_id: int, job: str, placed: Iterable[int], now: datetime
) -> list[str]:
    """A registered rank map put ranks on these nodes (ids) that they did not hold before: those out of service were
    placed before their gate. Returns their names."""
    ids = set(placed)
    if not ids:
        return []
    names = session.scalars(select(Node.name).where(Node.id.in_(ids), Node.state.in_(OUT_OF_SERVICE))).all()
    how = "the job's rank map was registered naming it"
    return [
        node.name
        for node in lifecycle.lock(session, names=names)
        if placed_before_gate(session, node=node, job_id=job_id, job=job, how=how, now=now)
    ]


def placed_by_agents(
    session: Session, *, reports: Mapping[int, tuple[int, str, list[tuple[int, datetime]]]], now: datetime
) -> list[str]:
    """Agents of out-of-service nodes reported ranks of a job: node id -> (job id, job, [(pid, seen at)]). Processes
    seen after the node went out that it did not run before then are new work: placed before its gate; on a cordoned
    node, only those of another job than the ones it ran (a cordon lets the running job be)."""
    if not reports:
        return []
    names = session.scalars(select(Node.name).where(Node.id.in_(list(reports)), Node.state.in_(OUT_OF_SERVICE))).all()
    out = []
    for node in lifecycle.lock(session, names=names):
        job_id, job, seen = reports[node.id]
        since = node.state_changed_at
        later = {pid for pid, at in seen if at > since}
        if not later:
            continue  # reported before it went out (a spooled batch)
        before = session.execute(
            select(ProcessSnapshot.pid, ProcessSnapshot.job_id)
            .where(
                ProcessSnapshot.node_id == node.id,
                ProcessSnapshot.ts >= since - _OLD_WORK,
                ProcessSnapshot.ts <= since,
            )
            .distinct()
        ).all()
        new = sorted(later - {pid for pid, _ in before})
        if not new:
            continue  # its old ranks, still dying (or finishing under a drain)
        if node.state == "cordoned" and job_id in {ran for _, ran in before}:
            continue  # a cordon drains new work only: the job it ran, restarting in its own allocation, is not placed
        shown = ", ".join(str(p) for p in new[:8]) + (f" and {len(new) - 8} more" if len(new) > 8 else "")
        how = f"its agent reports processes of the job it did not run before (pids {shown})"
        if placed_before_gate(session, node=node, job_id=job_id, job=job, how=how, now=now):
            out.append(node.name)
    return out


def before_gate(session: Session, *, job_id: int | None = None) -> list[BeforeGate]:
    """Nodes running work a scheduler placed on them before their return gate passed (of one job, if given), the
    longest first: what the overview, job and node pages show loudly."""
    query = (
        select(Node.id, Node.name, Node.work_before_gate_at, Job.external_id, Node.state_reason)
        .outerjoin(Job, Job.id == Node.current_job_id)
        .where(Node.work_before_gate_at.is_not(None))
        .order_by(Node.work_before_gate_at, Node.name)
    )
    if job_id is not None:
        query = query.where(Node.current_job_id == job_id)
    rows = session.execute(query).all()
    if not rows:
        return []
    was: dict[int, Any] = dict(
        session.execute(
            select(NodeEvent.node_id, NodeEvent.from_state)
            .where(NodeEvent.node_id.in_([r.id for r in rows]), NodeEvent.kind == "placed_before_gate")
            .order_by(NodeEvent.node_id, NodeEvent.at, NodeEvent.id)
        ).all()
    )  # the latest per node wins: ordered oldest first
    return [BeforeGate(r.name, r.work_before_gate_at, r.external_id, was.get(r.id), r.state_reason) for r in rows]


# -- the gate's verdict (service/checks/loop.py) ---------------------------------------------------


def gate_passed(
    session: Session,
    *,
    node: Node,
    diagnostics: dict[str, Any],
    undrain: bool,
    actor: str,
    reason: str,
    now: datetime,
    settings: Settings,
) -> str:
    """Healthy; where the scheduler still holds it out (a person's return), it is told to take it back."""
    if not lifecycle.gate_passed(session, node=node, diagnostics=diagnostics, actor=actor, reason=reason, now=now):
        return f"checks passed; the node is {node.state}, no longer waiting for its gate"
    if undrain:
        tell_schedulers(
            session, node=node, kind="return", reason=reason, actor=actor, now=now, ttl_s=settings.decision_ttl_s
        )
        return "passed: node healthy, schedulers told to return it"
    return "passed: node healthy"


def gate_failed(
    session: Session,
    *,
    node: Node,
    failed: list[tuple[int, str, str]],
    undrain: bool,
    directive: str,
    actor: str,
    now: datetime,
    settings: Settings,
) -> str:
    """Out again: back where it was returned from if the scheduler still holds it out; else an `evict` decision
    (its policy mode applies) and `returning` until the scheduler acknowledges it. `failed`: (result id, check,
    subject) of each failing check."""
    what = "; ".join(f"{check} {subject}" for _, check, subject in failed[:5]) + (
        f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    )
    reason = f"return gate failed on {node.name}: {what}"[:1000]
    evidence = {"checks": {"directive_id": directive, "check_results": [i for i, _, _ in failed]}}
    state = lifecycle.gate_failed(
        session, node=node, undrain=undrain, actor=actor, reason=reason, details=evidence, now=now
    )
    if state is None:
        return f"checks failed ({what}); the node is {node.state}, no longer waiting for its gate"
    if undrain:
        return f"checks failed ({what}): back to {state}"
    existing = session.scalar(
        select(Decision.id).where(Decision.node_id == node.id, Decision.kind == "evict", Decision.state.in_(_OPEN))
    )
    if existing is not None:
        return f"checks failed ({what}); evict decision {existing} already waits"
    mode = "pending"
    if settings.policy_mode == "shadow":
        mode = "shadow"
    elif settings.policy_mode == "approval" or "evict" in settings.policy_approval_required_for:
        mode = "awaiting_approval"
    else:  # the fleet circuit breaker may hold it for a person (service/breaker/)
        word = breaker.admit(session, candidates=[("evict", node.name)], now=now, settings=settings)[0]
        mode = "pending" if word.admitted else "awaiting_approval"
        evidence = {**evidence, "guard_rails": {breaker.RAIL: word.rail}} if word.rail else evidence
    decision = Decision(
        node_id=node.id,
        job_id=node.current_job_id,
        kind="evict",
        state=mode,
        confidence=GATE_EVICT_CONFIDENCE,
        reason=reason,
        evidence=evidence,
        created_at=now,
        expires_at=now + timedelta(seconds=settings.decision_ttl_s),
        actor=actor,
    )
    session.add(decision)
    session.flush()
    return f"checks failed ({what}): evict decision {decision.id} ({mode})"
