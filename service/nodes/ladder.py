"""A node's escalation ladder read from the database: its remedies (decisions), its faults (findings), its RMA mark.

The rung logic is pure (ml/ladder.py). A remedy is a decision carried out or on its way: a GPU reset, an eviction
(its rung, reboot, repair or rma, in its evidence's `ladder`; an eviction from before the ladder is a repair), or a
restart of a job whose incident was about this node (its anchor). Rejected, expired and failed ones did nothing;
shadow ones count, so shadow mode shows what `act` would decide. A fault is a finding on the node that asks to take
it out (action evict), at the time it was observed and, for an ongoing one, last seen. A remedy's time is when it
was decided: the scheduler's acknowledgement is stamped by the database's clock, and the backtest has none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ml.ladder import RUNGS, Fault, History, Remedy, Step, Thresholds, steps
from service.config import Settings
from service.errors import NotFound
from service.models import Decision, Finding, Incident, Node
from service.nodes.schemas import LadderOut, LadderStepOut

# A node in these states has not come back from its vendor replacement yet.
OUT = ("evicted", "in_repair")
# Decisions that did nothing: no remedy.
NOT_REMEDIES = ("rejected", "expired", "failed")
# The rung a decision stands on when its evidence does not say (made before the ladder, or by a person).
_RUNG_OF_KIND = {"restart": "restart", "reset_gpu": "reset_gpu", "evict": "repair"}


def thresholds(settings: Settings) -> Thresholds:
    return Thresholds(
        hold_s=settings.policy_ladder_hold_s,
        settle_s=settings.policy_ladder_settle_s,
        fatal_count=settings.policy_ladder_fatal_count,
        fatal_window_s=settings.policy_ladder_fatal_window_s,
        rma_count=settings.policy_ladder_rma_count,
        rma_window_s=settings.policy_ladder_rma_window_s,
    )


def rung_of(kind: str, evidence: dict[str, Any] | None) -> str | None:
    """The rung a decision stood on: its evidence's, else its kind's; None for a decision that is no remedy."""
    if kind not in _RUNG_OF_KIND:
        return None
    rung = ((evidence or {}).get("ladder") or {}).get("rung")
    return rung if rung in RUNGS else _RUNG_OF_KIND[kind]


def histories(
    session: Session,
    *,
    names: Collection[str],
    now: datetime,
    settings: Settings,
    since: datetime | None = None,
    afresh: bool = True,
) -> dict[str, History]:
    """Node -> its remedies and faults from `since` (by default, the ladder's reach) to `now` (three queries); with
    `afresh`, only since its vendor replacement for a node back from one (a replay at an earlier time passes False
    and cuts by `rma_cuts` itself)."""
    names = sorted(set(names))
    if not names:
        return {}
    reach = now - timedelta(seconds=thresholds(settings).lookback_s)
    since = reach if since is None else min(since, reach)
    nodes = session.execute(select(Node.id, Node.name, Node.rma_at, Node.state).where(Node.name.in_(names))).all()
    # A node back from a vendor replacement is another machine: nothing before its RMA counts.
    start = {
        name: max(since, rma_at) if afresh and rma_at is not None and state not in OUT else since
        for _, name, rma_at, state in nodes
    }
    by_id = {node_id: name for node_id, name, _, _ in nodes}
    remedies: dict[str, list[Remedy]] = defaultdict(list)
    rows = session.execute(
        select(Decision.id, Decision.kind, Decision.state, Decision.created_at, Decision.evidence, Node.name,
               Incident.anchor)
        .outerjoin(Node, Node.id == Decision.node_id)
        .outerjoin(Incident, Incident.id == Decision.incident_id)
        .where(
            Decision.created_at >= since,
            Decision.created_at <= now,
            Decision.state.not_in(NOT_REMEDIES),
            or_(
                Decision.kind.in_(("reset_gpu", "evict")) & Node.name.in_(names),
                (Decision.kind == "restart") & Incident.anchor.in_(names),
            ),
        )
    ).all()  # fmt: skip
    for decision_id, kind, state, at, evidence, node, anchor in rows:
        name = node or anchor
        rung = rung_of(kind, evidence)
        if name not in start or rung is None or at < start[name]:
            continue
        family = str((evidence or {}).get("root_cause") or "unknown")
        remedies[name].append(Remedy(rung, at, family, decision_id, state))
    faults: dict[str, list[Fault]] = defaultdict(list)
    for node_id, category, observed_at, last_seen_at in session.execute(
        select(Finding.node_id, Finding.category, Finding.observed_at, Finding.last_seen_at).where(
            Finding.node_id.in_(list(by_id)),
            Finding.action == "evict",
            Finding.role == "cause",
            or_(Finding.observed_at >= since, Finding.last_seen_at >= since),
            Finding.observed_at <= now,
        )
    ):
        name = by_id[node_id]
        for t in {observed_at, last_seen_at or observed_at}:
            if start[name] <= t <= now:
                faults[name].append(Fault(t, category))
    return {
        name: History(sorted(remedies[name], key=lambda r: r.at), sorted(faults[name], key=lambda f: f.at))
        for name in start
    }


def rma_cuts(session: Session, *, names: Collection[str]) -> dict[str, datetime]:
    """Node -> when it went out for its (latest) vendor replacement, for the nodes that did."""
    rows = session.execute(select(Node.name, Node.rma_at).where(Node.name.in_(list(names)), Node.rma_at.is_not(None)))
    return {name: at for name, at in rows}


def describe_step(step: Step) -> str:
    if step.held is None:
        return "too early to tell"
    if step.held:
        return "held"
    assert step.failed_at is not None
    return f"did not hold: faulted again at {step.failed_at:%Y-%m-%d %H:%M}"


def view(session: Session, *, name: str, now: datetime, settings: Settings) -> LadderOut:
    """The node's ladder as the API and the node page show it: each remedy (oldest first), whether it held, the
    current rung (its last remedy's, until that one held), its RMA mark."""
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        raise NotFound(f"no node {name}")
    limits = thresholds(settings)
    # Every remedy within reach, those before a vendor replacement too: the page tells the machine's story.
    history = histories(session, names=[name], now=now, settings=settings, afresh=False).get(name, History())
    ladder = steps(history, now=now, thresholds=limits)
    ids = [s.remedy.decision_id for s in ladder if s.remedy.decision_id is not None]
    decisions = {d.id: d for d in session.scalars(select(Decision).where(Decision.id.in_(ids or [0])))}
    out = []
    for s in ladder:
        d = decisions.get(s.remedy.decision_id or 0)
        out.append(
            LadderStepOut(
                decision_id=s.remedy.decision_id,
                kind=d.kind if d else "",
                rung=s.remedy.rung,
                rung_number=RUNGS.index(s.remedy.rung) + 1,
                at=s.remedy.at,
                family=s.remedy.family,
                state=s.remedy.state,
                held=s.held,
                failed_at=s.failed_at,
                outcome=describe_step(s),
                reason=d.reason if d else None,
            )
        )
    current = ladder[-1].remedy.rung if ladder and ladder[-1].held is not True else None
    return LadderOut(
        node=name,
        rung=current,
        rung_number=RUNGS.index(current) + 1 if current else None,
        rungs=list(RUNGS),
        steps=out,
        rma_at=node.rma_at,
        rma_reason=node.rma_reason,
        thresholds={
            "hold_s": limits.hold_s,
            "settle_s": limits.settle_s,
            "fatal_count": limits.fatal_count,
            "fatal_window_s": limits.fatal_window_s,
            "rma_count": limits.rma_count,
            "rma_window_s": limits.rma_window_s,
        },
    )


def mark_rma(node: Node, *, decision: Decision, now: datetime) -> None:
    """An eviction on the ladder's top rung was carried out: the node is out for a vendor replacement."""
    if decision.kind == "evict" and decision.state == "done" and rung_of(decision.kind, decision.evidence) == "rma":
        node.rma_at = now
        node.rma_reason = decision.reason
