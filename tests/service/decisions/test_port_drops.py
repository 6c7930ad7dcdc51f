"""Where the lone-flap rule looks for other machines' links going down (service/decisions/service.py, port_drops): the
fleet's network findings that say a port dropped, the agent's port watch's and the window rule's, and nothing else."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml.findings import Finding
from service.config import get_settings
from service.decisions.service import port_drops
from service.diagnosis.service import store_findings
from service.models import Job
from tests import jobs as seeded


def _network(node: str, at: datetime, key: str, evidence: dict[str, Any]) -> Finding:
    return Finding(
        detector="signatures",
        category="network",
        subject_kind="node",
        subject=node,
        confidence=0.85,
        summary=f"{key} on {node}",
        observed_at=at,
        node=node,
        key=f"{key}:{node}",
        evidence=evidence,
    )


def test_port_drops_are_the_ports_seen_down_not_the_peers_errors(session: Session) -> None:
    nodes = [f"pd-{uuid.uuid4().hex[:6]}-{n}" for n in range(3)]
    job = session.scalar(select(Job).where(Job.external_id == seeded.register(session, nodes, prefix="pd")))
    assert job is not None
    t0 = datetime.now(UTC)

    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    found = [
        # The agent's port watch: a flap named by its counter.
        _network(
            nodes[0],
            at(0),
            "port",
            {"port_flaps": [{"port": "ib:mlx5_0/1", "link_downed": 3, "at": at(0).isoformat()}]},
        ),
        # The window rule: a port that stayed down, in the windows ending then.
        _network(nodes[1], at(20), "down", {"rule": "down", "times": [at(10).isoformat(), at(20).isoformat()]}),
        # A peer's IB completion error of the same moment: its own link did not drop.
        _network(nodes[2], at(0.3), "ib", {"times": [at(0.3).isoformat()], "statuses": [12], "connections_lost": True}),
    ]
    store_findings(session, job=job, findings=found, now=at(30))
    session.flush()
    settings = get_settings()
    drops = port_drops(session, since=at(-5), settings=settings)
    assert {n: drops[n] for n in nodes if n in drops} == {nodes[0]: [at(0)], nodes[1]: [at(10), at(20)]}
    later = port_drops(session, since=at(15), settings=settings)
    assert {n: later[n] for n in nodes if n in later} == {nodes[1]: [at(20)]}
