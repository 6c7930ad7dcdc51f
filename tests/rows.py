"""Database rows for tests that start after diagnosis: a job, its nodes, an incident and its decisions."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.models import Decision, Incident, Job, Node


def job(session: Session, external_id: str | None = None) -> Job:
    row = Job(external_id=external_id or f"job-{uuid.uuid4().hex[:8]}", source="registered", world_size=16)
    session.add(row)
    session.flush()
    return row


def node(session: Session, name: str | None = None, **values: Any) -> Node:
    row = Node(name=name or f"node-{uuid.uuid4().hex[:8]}", **values)
    session.add(row)
    session.flush()
    return row


def incident(session: Session, *, job: Job, suspects: list[str] = (), **values: Any) -> Incident:  # type: ignore[assignment]
    row = Incident(
        job_id=job.id,
        root_cause=values.pop("root_cause", "gpu_hardware"),
        blame=values.pop("blame", "infrastructure"),
        confidence=0.95,
        summary=values.pop("summary", "Xid 79 (GPU has fallen off the bus)"),
        suspects=[
            {"node": n, "confidence": 0.95, "action": "evict", "reason": "Xid 79", "finding_ids": []} for n in suspects
        ],
        state=values.pop("state", "mitigating"),
        **values,
    )
    session.add(row)
    session.flush()
    return row


def decision(
    session: Session,
    *,
    incident: Incident | None,
    node: Node | None,
    kind: str = "evict",
    state: str = "pending",
    expires_in_s: float = 1800,
    reason: str | None = None,
    gpu: int | None = None,
    gpu_pci: str | None = None,
) -> Decision:
    now = datetime.now(UTC)
    row = Decision(
        incident_id=incident.id if incident else None,
        job_id=incident.job_id if incident else None,
        node_id=node.id if node else None,
        kind=kind,
        gpu=gpu if gpu is not None else (3 if kind == "reset_gpu" and gpu_pci is None else None),
        gpu_pci=gpu_pci,
        state=state,
        confidence=0.95,
        reason=reason or f"{kind} {node.name if node else 'job'}: Xid 79 (GPU has fallen off the bus)",
        evidence={"incident_id": incident.id if incident else None, "findings": []},
        created_at=now,
        expires_at=now + timedelta(seconds=expires_in_s),
    )
    session.add(row)
    session.flush()
    return row


def eviction(session: Session, *, node_name: str | None = None, **values: Any) -> tuple[Job, Node, Incident, Decision]:
    """A pending eviction of one node, for one incident of one job."""
    j = job(session)
    n = node(session, node_name)
    i = incident(session, job=j, suspects=[n.name])
    return j, n, i, decision(session, incident=i, node=n, **values)
