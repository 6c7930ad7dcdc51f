"""A machine back from its repair starts afresh: what its evidence showed before it came back into service (a reading
of the failed part, shipped late) decides nothing, and a fault of the returned machine is decided as ever. The calm
campaign evicted a node again 11 s after its return gate passed, on a row-remap failure reading stamped before its
return."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents.parsers import parse_text
from agents.parsers.kernel import KernelLogParser
from service.config import get_settings
from service.diagnosis import service as diagnosis
from service.models import Decision, Node
from service.nodes import lifecycle
from tests import jobs as seeded

XID_79 = "NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, GPU has fallen off the bus.\n"


def _evictions(session: Session, node: str) -> int:
    return len(
        session.scalars(
            select(Decision.id)
            .join(Node, Node.id == Decision.node_id)
            .where(Node.name == node, Decision.kind == "evict")
        ).all()
    )


def _xid(session: Session, node: str, job: str, at: datetime) -> None:
    seeded.store(session, node, job, at, parse_text(KernelLogParser(), XID_79, now=at))


def test_evidence_from_before_a_machines_return_decides_nothing_and_its_new_fault_does(session: Session) -> None:
    nodes = [f"ret-{uuid.uuid4().hex[:6]}-{n}" for n in range(2)]
    job = seeded.register(session, nodes, prefix="ret")
    now = datetime.now(UTC)
    node = session.scalar(select(Node).where(Node.name == nodes[0]))
    assert node is not None
    returned = now - timedelta(seconds=30)
    for kind, source, at, state in (
        ("evicted", "decision_ack", now - timedelta(minutes=5), "evicted"),
        ("returned", "scheduler", returned, "returning"),
        ("gate_passed", "checks", returned + timedelta(seconds=5), "healthy"),
    ):
        lifecycle.record(session, node=node, kind=kind, source=source, actor="test", now=at, to_state=state)
    session.flush()
    assert lifecycle.returned_at(session, names=nodes) == {nodes[0]: returned}

    _xid(session, nodes[0], job, returned - timedelta(seconds=11))  # the failed GPU's last word, read after the return
    diagnosis.diagnose_job(session, job_id=job, settings=get_settings(), now=now)
    assert _evictions(session, nodes[0]) == 0

    _xid(session, nodes[0], job, now - timedelta(seconds=5))  # the returned machine's own fault
    diagnosis.diagnose_job(session, job_id=job, settings=get_settings(), now=now)
    assert _evictions(session, nodes[0]) == 1
