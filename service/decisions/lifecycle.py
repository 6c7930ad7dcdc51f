"""A decision after it is made: approved or rejected by a person, acknowledged by a scheduler, or expired."""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, select, true, update
from sqlalchemy.orm import Session

from service.bundles import service as bundles
from service.config import Settings
from service.decisions import service
from service.decisions.schemas import DecisionOut
from service.errors import Conflict, NotFound
from service.fleet import stages as repair_stages
from service.models import Decision, Node
from service.nodes import lifecycle as nodes

OUTCOMES = ("done", "failed", "rejected")
FINAL = ("done", "failed", "rejected", "expired")
# Only these wait on someone: pending on a scheduler, awaiting_approval on a person.
OPEN = ("pending", "awaiting_approval")

AfterFinish = Callable[[Session, Decision, datetime], None]
# What else follows a closed decision, in its transaction, after its node: the incidents domain registers its
# resolution here when it is imported (as the API app does). Incidents show their decisions, so they import
# decisions; decisions importing incidents back would make the two domains a cycle.
_after_finish: list[AfterFinish] = []


def after_finish(hook: AfterFinish) -> AfterFinish:
    """Run `hook` after each decision is closed, in the same transaction; registering it twice runs it once."""
    if hook not in _after_finish:
        _after_finish.append(hook)
    return hook


def _locked(session: Session, decision_id: int) -> Decision:
    decision = session.scalar(select(Decision).where(Decision.id == decision_id).with_for_update())
    if decision is None:
        raise NotFound(f"no decision {decision_id}")
    return decision


def _refuse_closed(decision: Decision, now: datetime) -> None:
    """409 with the reason for a decision nobody may act on any more."""
    if decision.state == "expired" or (
        decision.state in OPEN and decision.expires_at is not None and decision.expires_at <= now
    ):
        expired = decision.expires_at.isoformat() if decision.expires_at else "earlier"
        raise Conflict(f"decision {decision.id} expired at {expired} without acknowledgement; do not act on it")
    if decision.state in ("done", "failed", "rejected"):
        acked = decision.acked_at.isoformat() if decision.acked_at else "earlier"
        raise Conflict(
            f"decision {decision.id} was already acknowledged as {decision.state} by {decision.actor} at {acked}"
        )
    if decision.state == "shadow":
        raise Conflict(f"decision {decision.id} was made in shadow mode: recorded for review, never to be acted on")


def acknowledge(
    session: Session,
    *,
    decision_id: int,
    outcome: str,
    message: str | None,
    actor: str,
    now: datetime,
    settings: Settings,
) -> DecisionOut:
    """A scheduler reports what it did. The same report twice is harmless; a different one is a conflict."""
    decision = _locked(session, decision_id)
    if decision.state == outcome:
        return service.get(session, decision_id=decision.id)
    if decision.state == "awaiting_approval":
        raise Conflict(f"decision {decision.id} is waiting for a person's approval; do not act on it yet")
    _refuse_closed(decision, now)
    return _finish(session, decision, outcome=outcome, message=message, actor=actor, now=now, settings=settings)


def approve(session: Session, *, decision_id: int, actor: str, now: datetime, settings: Settings) -> DecisionOut:
    """A person lets a decision that waited for approval go to the schedulers, with a fresh deadline."""
    decision = _locked(session, decision_id)
    if decision.state == "pending":
        return service.get(session, decision_id=decision.id)
    if decision.state != "awaiting_approval":
        _refuse_closed(decision, now)
        raise Conflict(f"decision {decision.id} is {decision.state}: only a decision awaiting approval is approved")
    _refuse_closed(decision, now)
    decision.state = "pending"
    decision.actor = actor
    decision.expires_at = now + timedelta(seconds=settings.decision_ttl_s)
    return service.get(session, decision_id=decision.id)


def reject(
    session: Session, *, decision_id: int, message: str | None, actor: str, now: datetime, settings: Settings
) -> DecisionOut:
    """A person overrules a decision before any scheduler acted on it."""
    decision = _locked(session, decision_id)
    if decision.state == "rejected":
        return service.get(session, decision_id=decision.id)
    _refuse_closed(decision, now)
    return _finish(session, decision, outcome="rejected", message=message, actor=actor, now=now, settings=settings)


def override(
    session: Session,
    *,
    decision_id: int,
    kind: str,
    node: str | None,
    message: str,
    actor: str,
    now: datetime,
    settings: Settings,
) -> DecisionOut:
    """A person replaces a decision no scheduler acted on with another action for the same incident.

    The old one is rejected, saying what replaced it; the new one goes to schedulers at once (a person
    already approved it) and carries a link back.
    """
    decision = _locked(session, decision_id)
    if decision.incident_id is None:
        raise Conflict(f"decision {decision.id} belongs to no incident: cordon or return the node instead")
    if decision.state not in OPEN:
        _refuse_closed(decision, now)
        raise Conflict(f"decision {decision.id} is {decision.state}: only a pending decision can be overridden")
    _refuse_closed(decision, now)
    node_row = None
    if node is not None:
        node_row = session.scalar(select(Node).where(Node.name == node))
        if node_row is None:
            raise NotFound(f"no node {node!r}")
    node_id = node_row.id if node_row else None
    if kind == decision.kind and node_id == decision.node_id:
        raise Conflict(f"decision {decision.id} already is {kind}{f' {node}' if node else ''}: approve it instead")
    taken = session.scalar(
        select(Decision).where(
            Decision.incident_id == decision.incident_id,
            Decision.kind == kind,
            func.coalesce(Decision.node_id, 0) == (node_id or 0),
        )
    )
    if taken is not None:
        raise Conflict(f"incident {decision.incident_id} already has decision {taken.id} ({kind}, {taken.state})")
    replacement = Decision(
        incident_id=decision.incident_id,
        job_id=decision.job_id,
        node_id=node_id,
        kind=kind,
        state="pending",
        confidence=1.0,
        reason=f"{kind}{f' {node}' if node else ''} by {actor}, instead of decision {decision.id}: {message}"[:1000],
        evidence={**(decision.evidence or {}), "manual": True, "overrides": decision.id, "actor": actor},
        created_at=now,
        expires_at=now + timedelta(seconds=settings.decision_ttl_s),
        actor=actor,
    )
    session.add(replacement)
    session.flush()
    bundles.request_for(session, decisions=[replacement], now=now, settings=settings)  # before the node leaves
    _finish(
        session,
        decision,
        outcome="rejected",
        message=f"overridden by decision {replacement.id} ({kind}{f' {node}' if node else ''}): {message}",
        actor=actor,
        now=now,
        settings=settings,
    )
    return service.get(session, decision_id=replacement.id)


def _finish(
    session: Session,
    decision: Decision,
    *,
    outcome: str,
    message: str | None,
    actor: str,
    now: datetime,
    settings: Settings,
) -> DecisionOut:
    """Close the decision; then its node's state and history, and (through `after_finish`) its incident, follow."""
    decision.state = outcome
    decision.outcome = outcome
    decision.outcome_message = message
    decision.acked_at = now
    decision.actor = actor
    repair_stages.decision_acted(session, decision=decision, now=now)
    if decision.node_id is not None:
        node = session.scalar(select(Node).where(Node.id == decision.node_id).with_for_update())
        if node is not None:
            nodes.on_acknowledged(session, decision=decision, node=node, now=now, settings=settings)
    for hook in _after_finish:
        hook(session, decision, now)
    return service.get(session, decision_id=decision.id)


def expire_overdue(session: Session, *, now: datetime, job_ids: Collection[int] | None = None) -> list[int]:
    """Decisions nobody acknowledged (or approved) in time expire, saying so. `job_ids`: only those jobs' (callers
    whose processes each keep their own clock); every job's by default."""
    mine = Decision.job_id.in_(job_ids) if job_ids is not None else true()
    return expire(
        session, Decision.state.in_(OPEN), Decision.expires_at <= now, mine,
        message="not acknowledged before it expired", now=now,
    )  # fmt: skip


def expire(session: Session, *where: ColumnElement[bool], message: str, now: datetime) -> list[int]:
    """The decisions matching `where` expire, saying why; their ids."""
    expired = session.scalars(
        update(Decision)
        .where(*where)
        .values(state="expired", outcome="expired", outcome_message=message, acked_at=now, actor=nodes.SYSTEM_ACTOR)
        .returning(Decision.id)
    ).all()
    return list(expired)
