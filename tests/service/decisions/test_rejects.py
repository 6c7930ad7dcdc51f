"""A person's reject is remembered: the machine they cleared is not accused again on the same kind of evidence,
under any incident, until different evidence about it arrives (the demo: "evict node-000" rejected, then
proposed again 3 s later on another counter under another incident)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml.findings import Finding
from service.config import get_settings
from service.decisions import lifecycle
from service.models import Decision, Job
from tests import rows
from tests.decide import decide, finding

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _finding(node: str, *, detector: str, category: str, metric: str, at: datetime) -> Finding:
    return finding(node, detector=detector, category=category, at=at, key=f"{node}:{category}:{metric}")


def _decide_on(session: Session, job: Job, findings: list[Finding], now: datetime) -> list[Decision]:
    ids = decide(session, job, findings, now).decisions
    return list(session.scalars(select(Decision).where(Decision.id.in_(ids))))


def test_a_rejected_suspect_is_not_accused_again_on_the_same_kind_of_evidence(session: Session) -> None:
    job, node = rows.job(session), rows.node(session)
    settings = get_settings()
    first = _finding(node.name, detector="peers", category="nvlink", metric="nvlink_rx_bytes", at=T0)
    (evict,) = _decide_on(session, job, [first], T0)
    assert (evict.kind, evict.node_id) == ("evict", node.id)
    lifecycle.reject(
        session,
        decision_id=evict.id,
        message="healthy: its peer lost a link",
        actor="operator:ana",
        now=T0,
        settings=settings,
    )

    # Another metric of the same comparison, under another incident (another category): nothing decided.
    later = T0 + timedelta(seconds=3)
    second = _finding(node.name, detector="peers", category="pcie", metric="pcie_rx_bytes", at=later)
    assert _decide_on(session, job, [first, second], later) == []
    assert session.scalar(select(Decision.id).where(Decision.node_id == node.id, Decision.state == "pending")) is None

    # Different evidence (a fatal Xid on it): the question is open again.
    xid = T0 + timedelta(minutes=2)
    third = _finding(node.name, detector="signatures", category="gpu_hardware", metric="Xid 79", at=xid)
    made = _decide_on(session, job, [first, second, third], xid)
    assert [(d.kind, d.node_id) for d in made] == [("evict", node.id)]


def test_a_schedulers_refusal_is_not_a_persons_verdict(session: Session) -> None:
    job, node = rows.job(session), rows.node(session)
    first = _finding(node.name, detector="peers", category="nvlink", metric="nvlink_rx_bytes", at=T0)
    (evict,) = _decide_on(session, job, [first], T0)
    lifecycle.acknowledge(
        session,
        decision_id=evict.id,
        outcome="rejected",
        message="no spare",
        actor="scheduler:slurm",
        now=T0,
        settings=get_settings(),
    )
    later = T0 + timedelta(seconds=3)
    second = _finding(node.name, detector="peers", category="pcie", metric="pcie_rx_bytes", at=later)
    made = _decide_on(session, job, [first, second], later)
    assert [(d.kind, d.node_id) for d in made] == [("evict", node.id)]
