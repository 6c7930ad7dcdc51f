"""A stored history of three incidents with hand-computed repair times (see ml tests for the same numbers).

Incident a (gpu_hardware, n1): evidence t0, opened +12 s, evict n1 decided +20 s, done +80 s; n1 evicted at +80 s,
in repair, returned at +1880 s.  detect 12, decide 8, act 60, return 1800.
Incident b (network, n2 and n3): evidence t1, opened +40 s, evictions decided +100 s; n2 done +130 s, n3 failed
+400 s; n2 evicted +130 s, returned +730 s.  detect 40, decide 60, act 30, return 600.
Incident c (gpu_hardware, n1 again): evidence t2, opened +2 s, decided +6 s, done +16 s; n1 evicted +16 s, still
out.  detect 2, decide 4, act 10, return none yet.
Every node was first seen ten days ago: 3 nodes x 240 h = 720 node-hours in a 30-day window, 3 failures.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from service.models import Decision, Finding, Incident, Job, Node, NodeEvent, Rank


@dataclass
class History:
    job: Job
    nodes: dict[str, Node]
    incidents: dict[str, Incident]


def build(session: Session, *, now: datetime | None = None) -> History:
    now = now or datetime.now(UTC)
    seen = now - timedelta(days=10)
    job = Job(external_id="llm-repair", source="registered", world_size=3, created_at=seen)
    session.add(job)
    nodes = {n: Node(name=n, created_at=seen, state_changed_at=seen) for n in ("n1", "n2", "n3")}
    session.add_all(nodes.values())
    session.flush()
    session.add_all(Rank(job_id=job.id, rank=r, node_id=nodes[n].id) for r, n in enumerate(nodes))

    def incident(key: str, root_cause: str, opened_at: datetime, state: str = "resolved") -> Incident:
        row = Incident(job_id=job.id, root_cause=root_cause, opened_at=opened_at, state=state, summary=key)
        session.add(row)
        session.flush()
        return row

    def finding(incident: Incident, at: datetime, n: str) -> None:
        session.add(
            Finding(
                dedup_key=f"{incident.id}-{at.isoformat()}",
                job_id=job.id,
                incident_id=incident.id,
                node_id=nodes[n].id,
                detector="xid",
                category="gpu_hardware",
                subject_kind="node",
                subject=n,
                confidence=0.95,
                summary="Xid 79",
                evidence={},
                observed_at=at,
            )
        )

    def decision(incident: Incident, n: str | None, state: str, created: datetime, acked: datetime | None) -> None:
        session.add(
            Decision(
                incident_id=incident.id,
                job_id=job.id,
                node_id=nodes[n].id if n else None,
                kind="evict" if n else "restart",
                state=state,
                confidence=0.95,
                reason="test",
                evidence={},
                created_at=created,
                acked_at=acked,
                expires_at=created + timedelta(hours=1),
            )
        )

    def event(n: str, at: datetime, kind: str, from_state: str, to_state: str, incident: Incident | None) -> None:
        session.add(
            NodeEvent(
                node_id=nodes[n].id,
                incident_id=incident.id if incident else None,
                at=at,
                kind=kind,
                from_state=from_state,
                to_state=to_state,
                actor="test",
                source="decision_ack" if kind.endswith("_done") else "diagnosis" if kind == "suspect" else "person",
            )
        )

    t0 = now - timedelta(hours=6)
    a = incident("a", "gpu_hardware", t0 + timedelta(seconds=12))
    finding(a, t0, "n1")
    finding(a, t0 + timedelta(seconds=30), "n1")
    decision(a, "n1", "done", t0 + timedelta(seconds=20), t0 + timedelta(seconds=80))
    event("n1", t0 + timedelta(seconds=15), "suspect", "healthy", "suspect", a)
    event("n1", t0 + timedelta(seconds=80), "evict_done", "suspect", "evicted", a)
    event("n1", t0 + timedelta(seconds=200), "repair", "evicted", "in_repair", None)
    event("n1", t0 + timedelta(seconds=1880), "return", "in_repair", "returned", None)

    t1 = now - timedelta(hours=4)
    b = incident("b", "network", t1 + timedelta(seconds=40))
    finding(b, t1, "n2")
    decision(b, "n2", "done", t1 + timedelta(seconds=100), t1 + timedelta(seconds=130))
    decision(b, "n3", "failed", t1 + timedelta(seconds=100), t1 + timedelta(seconds=400))
    event("n2", t1 + timedelta(seconds=130), "evict_done", "suspect", "evicted", b)
    event("n2", t1 + timedelta(seconds=730), "return", "evicted", "returned", None)

    t2 = now - timedelta(hours=2)
    c = incident("c", "gpu_hardware", t2 + timedelta(seconds=2), state="mitigating")
    finding(c, t2, "n1")
    decision(c, "n1", "done", t2 + timedelta(seconds=6), t2 + timedelta(seconds=16))
    event("n1", t2 + timedelta(seconds=16), "evict_done", "returned", "evicted", c)

    # Eight days ago: outside a 7-day window, inside a 30-day one; merged away, so never counted anyway.
    old = incident("old", "gpu_hardware", now - timedelta(days=8))
    old.resolution = "merged: its findings belong to another incident"
    session.flush()
    return History(job=job, nodes=nodes, incidents={"a": a, "b": b, "c": c})
