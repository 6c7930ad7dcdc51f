"""Nodes whose state waits on a person (a repair to start, a return to service, work a scheduler placed on a node
before its return gate), and every state's count: the counts are the node list's own filter (`Node.state == state`,
what /nodes?state= lists), so the two always agree."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import case, func, or_, select
from sqlalchemy.orm import Session

from service.models import Job, Node

ATTENTION_LIMIT = 50
# States that need no one: in service, or on the way back by itself (a return's checks running). A suspect is the
# diagnosis's business until it decides; a decision waiting for a person is listed with the decisions. A node running
# work before its return gate needs a person whatever its state: a scheduler placed it while faultline held it out.
_IN_HAND = ("healthy", "suspect", "returning")
BEFORE_GATE_STEP = (
    "a scheduler placed work on it before its return gate: watch its checks (a failure takes it out again)"
)
# What a person does about a node in each state; a state not named here (a new one) is listed without a hint.
NEXT_STEP = {
    "evicted": "send it to repair, or return it if nothing is wrong",
    "cordoned": "repair it, or return it to service",
    "in_repair": "return it to service once repaired (its checks run first)",
}
_ORDER = case({s: i for i, s in enumerate(NEXT_STEP)}, value=Node.state, else_=len(NEXT_STEP))
_NEEDS = or_(Node.state.not_in(_IN_HAND), Node.work_before_gate_at.is_not(None))


@dataclass(frozen=True)
class NodeNeed:
    name: str
    state: str
    since: datetime | None
    reason: str | None
    lemon: bool
    quarantined_until: datetime | None
    current_job: str | None
    before_gate: datetime | None = None  # when a scheduler placed work on it before its return gate passed

    @property
    def next_step(self) -> str | None:
        return BEFORE_GATE_STEP if self.before_gate is not None else NEXT_STEP.get(self.state)


def state_counts(session: Session) -> dict[str, int]:
    """Nodes per state, over all of them."""
    return dict(session.execute(select(Node.state, func.count()).group_by(Node.state)).all())  # type: ignore[arg-type]


def needing_a_person(session: Session, *, limit: int = ATTENTION_LIMIT) -> tuple[list[NodeNeed], int]:
    """Nodes waiting on a person: running work before their gate first, then evicted, then the longest waiting; and
    how many in all."""
    rows = session.execute(
        select(Node, Job.external_id)
        .outerjoin(Job, Job.id == Node.current_job_id)
        .where(_NEEDS)
        .order_by(Node.work_before_gate_at.is_(None), _ORDER, Node.state_changed_at.asc().nulls_last(), Node.name)
        .limit(limit)
    ).all()
    total = session.scalar(select(func.count()).select_from(Node).where(_NEEDS)) or 0
    items = [
        NodeNeed(
            name=n.name,
            state=n.state,
            since=n.state_changed_at,
            reason=n.state_reason,
            lemon=n.lemon,
            quarantined_until=n.quarantined_until,
            current_job=job,
            before_gate=n.work_before_gate_at,
        )
        for n, job in rows
    ]
    return items, total
