"""Nodes: creation on first mention; listing, details with history, and the manual transitions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import FromClause, Row, func, select, text, update
from sqlalchemy.dialects.postgresql import distinct_on, insert
from sqlalchemy.orm import Session

from ml.metrics import WINDOW_S
from ml.node_metrics import NODE_COLUMNS
from service.config import Settings
from service.errors import NotFound
from service.models import Decision, Gpu, Incident, Job, LogEvent, Node, NodeEvent, Rank
from service.models.signals import gpu_samples, node_samples
from service.nodes import lifecycle
from service.nodes.schemas import EvictionOut, NodeDetail, NodeEventOut, NodeIncidentOut, NodeOut, NodePage
from service.pagination import decode_cursor, encode_cursor
from service.schemas import Joined


def ensure_nodes(session: Session, *, names: set[str]) -> dict[str, int]:
    """Create the nodes that do not exist yet; return name -> id for all of them."""
    ordered = sorted(names)
    session.execute(insert(Node).values([{"name": n} for n in ordered]).on_conflict_do_nothing())
    rows = session.execute(select(Node.name, Node.id).where(Node.name.in_(ordered)))
    return {name: node_id for name, node_id in rows}


def get_by_name(session: Session, *, name: str, lock: bool = False) -> Node:
    query = select(Node).where(Node.name == name)
    node = session.scalar(query.with_for_update() if lock else query)
    if node is None:
        raise NotFound(f"no node named {name!r}")
    return node


def list_nodes(
    session: Session,
    *,
    state: str | None,
    lemon: bool | None,
    limit: int,
    cursor: str | None,
    name: str | None = None,
) -> NodePage:
    """Nodes in creation order, keyset-paginated; one query per page, whatever its size. `name`: a substring."""
    gpu_count = select(func.count(Gpu.id)).where(Gpu.node_id == Node.id).scalar_subquery()
    query = (
        select(Node, Job.external_id, gpu_count)
        .outerjoin(Job, Job.id == Node.current_job_id)
        .order_by(Node.id)
        .limit(limit + 1)
    )
    if state:
        query = query.where(Node.state == state)
    if lemon is not None:
        query = query.where(Node.lemon.is_(lemon))
    if name:
        query = query.where(Node.name.icontains(name, autoescape=True))
    if cursor:
        query = query.where(Node.id > decode_cursor(cursor))
    rows = session.execute(query).all()
    items = [NodeOut.model_validate(Joined(n, current_job=j, gpus=g, **_nvlink(n))) for n, j, g in rows[:limit]]
    return NodePage(items=items, next_cursor=encode_cursor(rows[limit - 1][0].id) if len(rows) > limit else None)


def _nvlink(node: Node) -> dict[str, str | None]:
    """Its NVLink domain and clique, from the labels its heartbeats keep (service/ingest/fabric.py)."""
    labels = node.labels or {}
    return {"nvlink_domain": labels.get("nvlink_domain"), "nvlink_clique": labels.get("nvlink_clique")}


def describe(session: Session, *, name: str, history_limit: int = 100) -> NodeDetail:
    """State, GPUs, the open incidents that accuse it, and its history across jobs."""
    node = get_by_name(session, name=name)
    current_job = (
        session.scalar(select(Job.external_id).where(Job.id == node.current_job_id)) if node.current_job_id else None
    )
    gpus = session.scalars(select(Gpu).where(Gpu.node_id == node.id).order_by(Gpu.index)).all()
    incidents = session.execute(
        select(Incident, Job.external_id)
        .join(Job, Job.id == Incident.job_id)
        .where(Incident.state != "resolved", Incident.suspects.contains([{"node": node.name}]))
        .order_by(Incident.id.desc())
    ).all()
    events = session.execute(
        select(NodeEvent, Job.external_id)
        .outerjoin(Job, Job.id == NodeEvent.job_id)
        .where(NodeEvent.node_id == node.id)
        .order_by(NodeEvent.at.desc(), NodeEvent.id.desc())
        .limit(history_limit)
    ).all()
    eviction = session.execute(
        select(NodeEvent, Job.external_id)
        .outerjoin(Job, Job.id == NodeEvent.job_id)
        .where(NodeEvent.node_id == node.id, NodeEvent.kind == "evict_done")
        .order_by(NodeEvent.at.desc(), NodeEvent.id.desc())
        .limit(1)
    ).first()
    jobs = session.scalars(
        select(Job.external_id)
        .join(Rank, Rank.job_id == Job.id)
        .where(Rank.node_id == node.id)
        .group_by(Job.id)
        .order_by(func.max(Rank.updated_at).desc())
        .limit(50)
    ).all()
    return NodeDetail.model_validate(
        Joined(
            node,
            current_job=current_job,
            gpus=len(gpus),
            gpu_list=gpus,
            **_nvlink(node),
            open_incidents=[
                NodeIncidentOut.model_validate(
                    Joined(
                        i,
                        job_id=job,
                        confidence=next((s["confidence"] for s in i.suspects if s.get("node") == node.name), 0.0),
                    )
                )
                for i, job in incidents
            ],
            history=[NodeEventOut.model_validate(Joined(e, job_id=job)) for e, job in events],
            last_eviction=_eviction(*eviction) if eviction else None,
            jobs=list(jobs),
        )
    )


def _eviction(event: NodeEvent, job: str | None) -> EvictionOut:
    gpus = (event.details or {}).get("gpus") or []
    return EvictionOut(
        at=event.at,
        reason=event.reason,
        gpus=[int(g) for g in gpus if isinstance(g, int)],
        job_id=job,
        incident_id=event.incident_id,
        decision_id=event.decision_id,
    )


def states_and_jobs(session: Session) -> Sequence[Row[str, str, bool, str | None, dict[str, Any] | None]]:
    """Every node's name, state and lemon flag, its current job's external id and its inventory labels (rack,
    switch), by name: one query."""
    return session.execute(
        select(Node.name, Node.state, Node.lemon, Job.external_id, Node.labels)
        .outerjoin(Job, Job.id == Node.current_job_id)
        .order_by(Node.name)
    ).all()


def latest_gpu_samples(session: Session, *, name: str, since: datetime, columns: Sequence[str]) -> Sequence[Row[Any]]:
    """The node's latest metric sample of each GPU since `since` (gpu, ts and `columns`): one DISTINCT ON query."""
    return _latest_of_each(session, gpu_samples(since), "gpu", name=name, since=since, columns=columns)


def _latest_of_each(
    session: Session, table: FromClause, unit: str, *, name: str, since: datetime, columns: Sequence[str]
) -> Sequence[Row[Any]]:
    c = table.c
    node_id = select(Node.id).where(Node.name == name).scalar_subquery()
    return session.execute(
        select(c[unit], c.ts, *(c[col] for col in columns))
        .ext(distinct_on(c[unit]))
        .where(c.node_id == node_id, c.ts >= since)
        .order_by(c[unit], c.ts.desc())
    ).all()


def log_events(
    session: Session, *, name: str, since: datetime, until: datetime, skip_kinds: Sequence[str], limit: int
) -> Sequence[Row[LogEvent, str | None]]:
    """The node's newest log events in [since, until), none of `skip_kinds`, each with its job's external id."""
    node_id = select(Node.id).where(Node.name == name).scalar_subquery()
    return session.execute(
        select(LogEvent, Job.external_id)
        .outerjoin(Job, Job.id == LogEvent.job_id)
        .where(
            LogEvent.node_id == node_id,
            LogEvent.ts >= since,
            LogEvent.ts < until,
            LogEvent.kind.not_in(skip_kinds),
        )
        .order_by(LogEvent.ts.desc(), LogEvent.id.desc())
        .limit(limit)
    ).all()


def log_events_by_id(
    session: Session, *, ids: Sequence[int]
) -> Sequence[Row[int, datetime, str | None, str, str, str | None, int | None, str]]:
    """These log events, oldest first: id, ts, node name, source, kind, severity, rank and line."""
    if not ids:
        return []
    return session.execute(
        select(
            LogEvent.id,
            LogEvent.ts,
            Node.name,
            LogEvent.source,
            LogEvent.kind,
            LogEvent.severity,
            LogEvent.rank,
            LogEvent.line,
        )
        .outerjoin(Node, Node.id == LogEvent.node_id)
        .where(LogEvent.id.in_(ids))
        .order_by(LogEvent.ts, LogEvent.id)
    ).all()


def tell_schedulers(
    session: Session, *, node: Node, kind: str, reason: str, actor: str, now: datetime, ttl_s: float
) -> None:
    """Tell schedulers (a cordon or a return), superseding what they were still told to do with the node."""
    # A return also drops a pending GPU reset: the person vouches for the whole node (the Kubernetes adapter's
    # return clears the GPU marks too).
    superseded = ("return",) if kind == "cordon" else ("evict", "cordon", "reset_gpu")
    session.execute(
        update(Decision)
        .where(
            Decision.node_id == node.id,
            Decision.kind.in_(superseded),
            Decision.state.in_(("pending", "awaiting_approval")),
        )
        .values(
            state="rejected",
            outcome="rejected",
            outcome_message=f"superseded: {kind} by {actor}",
            acked_at=now,
            actor=actor,
        )
    )
    session.add(
        Decision(
            node_id=node.id,
            kind=kind,
            state="pending",
            confidence=1.0,
            reason=f"{kind} {node.name} by {actor}: {reason}"[:1000],
            evidence={"manual": True, "actor": actor, "reason": reason},
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_s),
            actor=actor,
        )
    )


def cordon(session: Session, *, name: str, reason: str, actor: str, now: datetime, settings: Settings) -> NodeDetail:
    """A person takes the node out of service; schedulers get a `cordon` decision. Idempotent."""
    node = get_by_name(session, name=name, lock=True)
    if lifecycle.cordon(session, node=node, reason=reason, actor=actor, now=now):
        tell_schedulers(
            session, node=node, kind="cordon", reason=reason, actor=actor, now=now, ttl_s=settings.decision_ttl_s
        )
    session.flush()
    return describe(session, name=name)


def repair(session: Session, *, name: str, reason: str, actor: str, now: datetime) -> NodeDetail:
    """The node went to repair. Idempotent."""
    node = get_by_name(session, name=name, lock=True)
    lifecycle.repair(session, node=node, reason=reason, actor=actor, now=now)
    session.flush()
    return describe(session, name=name)


def return_to_service(
    session: Session,
    *,
    name: str,
    reason: str,
    diagnostics: dict[str, Any] | None,
    force: bool,
    actor: str,
    now: datetime,
    settings: Settings,
    source: str = "person",
) -> NodeDetail:
    """Back to service if quarantine and diagnostics allow. With passing diagnostics (or force) it is healthy and
    schedulers get a `return` decision; without, it is `returning` and its agent runs the return gate, whose pass
    sends that decision (service/checks/loop.py). Idempotent."""
    node = get_by_name(session, name=name, lock=True)
    went = lifecycle.return_to_service(
        session,
        node=node,
        reason=reason,
        actor=actor,
        diagnostics=diagnostics,
        force=force,
        now=now,
        settings=settings,
        source=source,
    )
    if went == "healthy":
        tell_schedulers(
            session, node=node, kind="return", reason=reason, actor=actor, now=now, ttl_s=settings.decision_ttl_s
        )
    session.flush()
    return describe(session, name=name)


WINDOW = timedelta(seconds=WINDOW_S)

# Per window of one subject (a port, the host) in a job: the node's value against the other machines' median and
# p10-p90 band. Cumulative counters are drawn as increases per second between consecutive windows.
_AGAINST_PEERS = """
WITH w AS (
  SELECT node_id, window_start, {value} AS v
  FROM node_windows WHERE job_id = :job AND subject = :subject AND window_start >= :lo AND window_start < :hi
)
SELECT window_start,
  max(v) FILTER (WHERE node_id = :node) AS value,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY v) FILTER (WHERE node_id <> :node) AS peer_median,
  percentile_cont(0.1) WITHIN GROUP (ORDER BY v) FILTER (WHERE node_id <> :node) AS peer_p10,
  percentile_cont(0.9) WITHIN GROUP (ORDER BY v) FILTER (WHERE node_id <> :node) AS peer_p90
FROM w WHERE v IS NOT NULL GROUP BY window_start ORDER BY window_start
"""


def subject_against_peers(
    session: Session, *, job_id: str, node: str, subject: str, column: str, start: datetime, end: datetime
) -> list[dict[str, Any]]:
    """Windows of one node's subject and metric next to the job's other machines' (empty for an unknown metric)."""
    if column not in NODE_COLUMNS:
        return []
    job = session.scalar(select(Job.id).where(Job.external_id == job_id))
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    if job is None or node_id is None:
        return []
    if NODE_COLUMNS[column]:
        step = "OVER (PARTITION BY node_id ORDER BY window_start)"
        value = (
            f"greatest({column}_max - lag({column}_max) {step}, 0) "
            f"/ nullif(extract(epoch FROM last_ts - lag(last_ts) {step}), 0)"
        )
    else:
        value = column
    rows = session.execute(
        text(_AGAINST_PEERS.format(value=value)),
        {"job": job, "node": node_id, "subject": subject, "lo": start, "hi": end},
    ).mappings()
    return [
        {**row, "start": row["window_start"].isoformat(), "end": (row["window_start"] + WINDOW).isoformat()}
        for row in rows
        if row["value"] is not None
    ]


def latest_node_samples(session: Session, *, name: str, since: datetime, columns: Sequence[str]) -> Sequence[Row[Any]]:
    """The node's latest machine-level reading of each subject since `since` (subject, ts and `columns`)."""
    return _latest_of_each(session, node_samples, "subject", name=name, since=since, columns=columns)


def gpu_inventory(session: Session, *, nodes: Sequence[str]) -> Sequence[Row[tuple[str, int, str | None]]]:
    """(node, GPU index, PCI bus id) for these nodes' GPUs, as their agents last reported them."""
    if not nodes:
        return []
    query = select(Node.name, Gpu.index, Gpu.pci_bus_id).join(Gpu, Gpu.node_id == Node.id)
    return session.execute(query.where(Node.name.in_(list(nodes)))).all()
