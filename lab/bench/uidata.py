"""A cluster's worth of rows for the web UI's benchmark and browser tests: thousands of nodes and incidents.

Bulk inserts of synthetic but well-formed rows (nodes, GPUs, jobs, ranks, incidents with findings and
decisions, node histories, kernel log lines), so pages can be measured at the size they must stay fast at.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from service.models import Decision, Finding, Gpu, Incident, Job, LogEvent, Node, NodeEvent, Rank

_CAUSES = (
    ("gpu_hardware", "critical", "Xid 79 (GPU has fallen off the bus) on GPU {gpu}", "evict"),
    ("network", "major", "IB completion error status 12 (transport retry exceeded) on mlx5_{gpu}", "evict"),
    ("hang", "critical", "no step progress for 600 s; stacks: rank {rank} outside the collective", "evict"),
    ("straggler", "major", "GPU {gpu} is its peers' outlier for 120 s (low power)", "diagnose"),
    ("user_code", "major", "the same exception on every rank: KeyError: 'labels'", "rollback"),
    ("nvlink", "major", "Xid 74 (NVLink error) on GPU {gpu}", "evict"),
)


@dataclass
class Seeded:
    nodes: int
    jobs: int
    incidents: int
    open_incidents: int
    job_ids: list[str]
    incident_ids: list[int]


def seed(
    session: Session,
    *,
    nodes: int = 2048,
    nodes_per_job: int = 128,
    gpus_per_node: int = 8,
    incidents: int = 3000,
    open_incidents: int = 40,
    prefix: str = "seed",
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> Seeded:
    """Insert the rows; names start with `prefix` so a seed never collides with real nodes and jobs."""
    now = now or datetime.now(UTC)
    rng = rng or random.Random(7)
    jobs_n = max(1, nodes // nodes_per_job)
    job_rows = [
        {
            "external_id": f"{prefix}-job-{j:03d}",
            "world_size": nodes_per_job * gpus_per_node,
            "tp": gpus_per_node,
            "pp": 4 if nodes_per_job % 4 == 0 else 1,
            "dp": nodes_per_job // (4 if nodes_per_job % 4 == 0 else 1),
            "rank_order": "tp-dp-pp",
            "source": "registered",
            "created_at": now - timedelta(days=3),
            "updated_at": now,
            # Running, but not reporting right now: diagnosis passes leave the seeded incidents as they are.
            "last_seen_at": now - timedelta(minutes=30),
        }
        for j in range(jobs_n)
    ]
    job_ids = list(session.scalars(insert(Job).returning(Job.id, sort_by_parameter_order=True), job_rows))
    states = ["healthy"] * 40 + ["suspect", "cordoned", "evicted", "in_repair", "returning"]
    node_rows = [
        {
            "name": f"{prefix}-node-{n:05d}",
            "state": rng.choice(states),
            "current_job_id": job_ids[min(n // nodes_per_job, jobs_n - 1)],
            "last_seen_at": now,
            "lemon": n % 397 == 0,
        }
        for n in range(nodes)
    ]
    node_ids = list(session.scalars(insert(Node).returning(Node.id, sort_by_parameter_order=True), node_rows))
    session.execute(
        insert(Gpu),
        [
            {"node_id": nid, "index": g, "uuid": f"GPU-{uuid.uuid4()}", "model": "NVIDIA H100 80GB HBM3"}
            for nid in node_ids
            for g in range(gpus_per_node)
        ],
    )
    session.execute(
        insert(Rank),
        [
            {
                "job_id": job_ids[min(n // nodes_per_job, jobs_n - 1)],
                "rank": (n % nodes_per_job) * gpus_per_node + g,
                "node_id": nid,
                "local_rank": g,
                "gpu_index": g,
                "pid": 1000 + g,
                "updated_at": now,
            }
            for n, nid in enumerate(node_ids)
            for g in range(gpus_per_node)
        ],
    )
    incident_ids = _incidents(
        session, node_rows, node_ids, job_ids, nodes_per_job, incidents, open_incidents, now, rng, gpus_per_node
    )
    return Seeded(
        nodes=nodes,
        jobs=jobs_n,
        incidents=incidents,
        open_incidents=min(open_incidents, incidents),
        job_ids=[j["external_id"] for j in job_rows],
        incident_ids=incident_ids,
    )


def _incidents(
    session: Session,
    node_rows: list[dict[str, Any]],
    node_ids: list[int],
    job_ids: list[int],
    nodes_per_job: int,
    count: int,
    open_count: int,
    now: datetime,
    rng: random.Random,
    gpus_per_node: int,
) -> list[int]:
    """Incidents spread over the last 30 days; the newest `open_count` still open. Each has one finding
    per suspect, one decision, a kernel log line and a node history entry."""
    plans = []
    jobs_n = len(job_ids)
    # One open incident per job and root cause (a unique index): the open ones walk jobs, then causes.
    open_count = min(open_count, count, jobs_n * len(_CAUSES))
    for i in range(count):
        k = i - (count - open_count)
        is_open = k >= 0
        job_index = k % jobs_n if is_open else rng.randrange(jobs_n)
        n = job_index * nodes_per_job + rng.randrange(nodes_per_job)
        cause, severity, summary, action = _CAUSES[(k // jobs_n) % len(_CAUSES) if is_open else i % len(_CAUSES)]
        opened = now - timedelta(minutes=(count - i) * (30 * 24 * 60 / max(count, 1)))
        text = summary.format(gpu=rng.randrange(gpus_per_node), rank=rng.randrange(nodes_per_job * gpus_per_node))
        plans.append((n, cause, severity, text, action, opened, is_open))
    incident_ids = list(
        session.scalars(
            insert(Incident).returning(Incident.id, sort_by_parameter_order=True),
            [
                {
                    "job_id": job_ids[min(n // nodes_per_job, len(job_ids) - 1)],
                    "state": "mitigating" if is_open else "resolved",
                    "root_cause": cause,
                    "blame": "user_code" if cause == "user_code" else "infrastructure",
                    "severity": severity,
                    "confidence": 0.9,
                    "summary": text,
                    "suspects": []
                    if cause == "user_code"
                    else [
                        {
                            "node": node_rows[n]["name"],
                            "confidence": 0.9,
                            "action": action,
                            "reason": text,
                            "finding_ids": [],
                        }
                    ],
                    "opened_at": opened,
                    "updated_at": opened + timedelta(minutes=2),
                    "resolved_at": None if is_open else opened + timedelta(minutes=rng.randint(3, 40)),
                    "resolution": None if is_open else "mitigated: evict done",
                }
                for n, cause, severity, text, action, opened, is_open in plans
            ],
        )
    )
    log_ids = list(
        session.scalars(
            insert(LogEvent).returning(LogEvent.id, sort_by_parameter_order=True),
            [
                {
                    "batch_id": uuid.uuid4(),
                    "node_id": node_ids[n],
                    "job_id": job_ids[min(n // nodes_per_job, len(job_ids) - 1)],
                    "ts": opened - timedelta(seconds=5),
                    "source": "kernel",
                    "kind": "xid",
                    "severity": "error",
                    "line": f"NVRM: Xid (PCI:0000:{n % 256:02x}:00): 79, pid=1234, GPU has fallen off the bus.",
                }
                for n, _, _, _, _, opened, _ in plans
            ],
        )
    )
    session.execute(
        insert(Finding),
        [
            {
                "dedup_key": f"seed:{iid}",
                "job_id": job_ids[min(n // nodes_per_job, len(job_ids) - 1)],
                "incident_id": iid,
                "node_id": node_ids[n],
                "detector": "signatures",
                "category": cause,
                "subject_kind": "node",
                "subject": node_rows[n]["name"],
                "confidence": 0.9,
                "summary": text,
                "action": action,
                "evidence": {"signals": [{"type": "log", "id": log_id}]},
                "observed_at": opened,
                "created_at": opened,
            }
            for iid, log_id, (n, cause, _, text, action, opened, _) in zip(incident_ids, log_ids, plans, strict=True)
        ],
    )
    decided = [
        {
            "incident_id": iid,
            "job_id": job_ids[min(n // nodes_per_job, len(job_ids) - 1)],
            "node_id": None if action == "rollback" else node_ids[n],
            "kind": action,
            "state": ("awaiting_approval" if i % 2 else "pending") if is_open else "done",
            "confidence": 0.9,
            "reason": text,
            "evidence": {"incident_id": iid},
            "created_at": opened + timedelta(seconds=3),
            "expires_at": now + timedelta(hours=1) if is_open else opened + timedelta(minutes=30),
            "acked_at": None if is_open else opened + timedelta(minutes=1),
            "outcome": None if is_open else "done",
        }
        for i, (iid, (n, _, _, text, action, opened, is_open)) in enumerate(zip(incident_ids, plans, strict=True))
    ]
    session.execute(insert(Decision), decided)
    session.execute(
        insert(NodeEvent),
        [
            {
                "node_id": node_ids[n],
                "incident_id": iid,
                "at": opened,
                "kind": "suspect",
                "from_state": "healthy",
                "to_state": "suspect",
                "actor": "faultline",
                "source": "diagnosis",
                "reason": text,
            }
            for iid, (n, _, _, text, _, opened, _) in zip(incident_ids, plans, strict=True)
        ],
    )
    return incident_ids


def existing(session: Session, *, prefix: str = "seed") -> int:
    """How many seeded nodes are there already (a second seed with the same prefix would collide)."""
    return len(session.scalars(select(Node.id).where(Node.name.like(f"{prefix}-node-%")).limit(1)).all())
