"""NVLink domains (GB200 NVL72 and alike): which nodes share one, whether its fabric is healthy, and the domain
incident when it is not.

A domain is a fabric cluster UUID that the nodes' GPUs report (NVML's fabric info, stored on `gpus` by ingest:
service/ingest/fabric.py). `check` judges each domain (ml/nvlink_domains.py) from its trays' fabric info, their
fabric manager's state and their recent NVLink findings:
- the switch side failed (the fabric manager degraded, or fabric trouble on several trays within the window): ONE
  shared incident for the domain (component_kind `nvlink_domain`, component: the cluster UUID) whose decision
  cordons every tray of the domain (service/shared_causes/): no 18 node incidents, no per-node eviction of its
  healthy trays for their NVLink findings (diagnosis leaves out what a shared incident explains);
- one tray shows it: nothing here; that tray's own findings take it out through the per-node eviction.
Functions flush; the caller commits.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ml import nvlink_domains
from ml.nvlink_domains import GpuFabric, Tray, Verdict
from service.config import Settings
from service.models import Finding, Gpu, Node, SharedIncident
from service.shared_causes import service as shared_causes

COMPONENT_KIND = "nvlink_domain"
# What a failing domain fabric explains on its trays: NVLink errors, and the slowness of degraded bandwidth.
CATEGORIES = ("nvlink", "straggler")
# Node states a scheduler may place new work on.
_IN_SERVICE = ("healthy", "returning")


@dataclass(slots=True)
class DomainNode:
    id: int
    name: str
    state: str
    last_seen_at: datetime | None
    tray: Tray


@dataclass(slots=True)
class Domain:
    cluster_uuid: str
    nodes: list[DomainNode] = field(default_factory=list)
    verdict: Verdict = field(default_factory=lambda: Verdict("none"))
    incident: SharedIncident | None = None

    @property
    def healthy(self) -> bool:
        return self.incident is None and self.verdict.level == "none"

    @property
    def state(self) -> str:
        """failed (an open domain incident, or the switch side failing now), degraded (a tray), healthy."""
        if self.incident is not None or self.verdict.level == "domain":
            return "failed"
        return "degraded" if self.verdict.level == "tray" else "healthy"

    def usable(self) -> list[str]:
        """Trays a tensor-parallel group may be placed on now: none in a failed domain; else in service, with their
        fabric registered and nothing wrong."""
        if self.state == "failed":
            return []
        return [n.name for n in self.nodes if n.state in _IN_SERVICE and nvlink_domains.usable(n.tray)]


def load(
    session: Session, *, now: datetime, settings: Settings, clusters: Collection[str] | None = None
) -> list[Domain]:
    """The domains (all, or these cluster UUIDs) with their trays and verdicts, in cluster order."""
    query = (
        select(
            Gpu.fabric_cluster_uuid,
            Node.id,
            Node.name,
            Node.state,
            Node.last_seen_at,
            Node.labels["fabric_manager"].astext,
            Gpu.index,
            Gpu.fabric_clique_id,
            Gpu.fabric_state,
            Gpu.fabric_status,
            Gpu.fabric_health,
            Gpu.fabric_degraded_bw,
            Gpu.fabric_gfm,
        )
        .join(Node, Node.id == Gpu.node_id)
        .where(Gpu.fabric_cluster_uuid.is_not(None))
        .order_by(Gpu.fabric_cluster_uuid, Node.name, Gpu.index)
    )
    if clusters is not None:
        query = query.where(Gpu.fabric_cluster_uuid.in_(list(clusters)))
    rows = session.execute(query).all()
    if not rows:
        return []
    node_ids = {r[1] for r in rows}
    since = now - timedelta(seconds=settings.nvlink_domain_window_s)
    findings = dict(
        session.execute(
            select(Finding.node_id, func.count())
            .where(
                Finding.node_id.in_(node_ids),
                Finding.category == "nvlink",
                func.coalesce(Finding.last_seen_at, Finding.observed_at) >= since,
                Finding.observed_at <= now,
            )
            .group_by(Finding.node_id)
        ).all()
    )
    gathered: dict[str, dict[int, tuple[Any, list[GpuFabric]]]] = {}
    for cluster, node_id, name, state, seen, manager, index, clique, fstate, status, health, bw, gfm in rows:
        _, gpus = gathered.setdefault(cluster, {}).setdefault(node_id, ((name, state, seen, manager), []))
        gpus.append(GpuFabric(index, cluster, clique, fstate, status, health, bw, gfm))
    incidents = {
        i.component: i
        for i in session.scalars(
            select(SharedIncident).where(
                SharedIncident.component_kind == COMPONENT_KIND,
                SharedIncident.state == "open",
                SharedIncident.component.in_(list(gathered)),
            )
        )
    }
    domains = []
    for cluster, members in gathered.items():
        domain = Domain(cluster, incident=incidents.get(cluster))
        for node_id, ((name, state, seen, manager), gpus) in members.items():
            tray = Tray(name, gpus, manager, int(findings.get(node_id, 0)))
            domain.nodes.append(DomainNode(node_id, name, state, seen, tray))
        domain.verdict = nvlink_domains.judge(
            [n.tray for n in domain.nodes], min_trays=settings.nvlink_domain_min_trays
        )
        domains.append(domain)
    return domains


def check(
    session: Session, *, now: datetime, settings: Settings, clusters: Collection[str] | None = None
) -> list[SharedIncident]:
    """Open (or join) the domain incident of every domain whose switch side fails, and decide it: its trays cordoned.
    Idempotent: a domain already decided gets no second incident and no second cordon. Returns the domain incidents
    touched."""
    touched = []
    for domain in load(session, now=now, settings=settings, clusters=clusters):
        if domain.verdict.level != "domain":
            continue
        incident = shared_causes.open_or_update(
            session,
            component_kind=COMPONENT_KIND,
            component=domain.cluster_uuid,
            node_ids=[n.id for n in domain.nodes],
            summary=f"NVLink domain {domain.cluster_uuid} ({len(domain.nodes)} trays): {domain.verdict.summary}",
            evidence={
                "categories": list(CATEGORIES),
                "confidence": 0.9,
                "level": "domain",
                "switch_side": domain.verdict.switch_side,
                "troubled_trays": domain.verdict.troubled,
                "trays": len(domain.nodes),
            },
            now=now,
        )
        shared_causes.decide_for_component(session, incident=incident, now=now, settings=settings)
        domain.incident = incident
        touched.append(incident)
    return touched


def clusters_of(session: Session, *, node_names: Collection[str]) -> list[str]:
    """The NVLink domains these nodes' GPUs are in."""
    if not node_names:
        return []
    return list(
        session.scalars(
            select(Gpu.fabric_cluster_uuid)
            .join(Node, Node.id == Gpu.node_id)
            .where(Node.name.in_(list(node_names)), Gpu.fabric_cluster_uuid.is_not(None))
            .distinct()
            .order_by(Gpu.fabric_cluster_uuid)
        )
    )


def check_nodes(session: Session, *, node_names: Collection[str], now: datetime, settings: Settings) -> list[int]:
    """`check` for the domains of these nodes (those with NVLink findings in a job's diagnosis pass); the ids of
    the domain incidents opened or joined."""
    if not settings.nvlink_domains_enabled:
        return []
    clusters = clusters_of(session, node_names=node_names)
    if not clusters:
        return []
    return [i.id for i in check(session, now=now, settings=settings, clusters=clusters)]


def settling(
    session: Session, *, findings: Collection[tuple[str, str, datetime]], now: datetime, settings: Settings
) -> set[str]:
    """Trays whose NVLink findings wait for this pass: in an NVLink domain, their first open NVLink finding seen
    (`findings`: node, category, when the service stored it) less than `nvlink_domain_settle_s` ago. A switch
    tray's failure reaches every tray of the domain within seconds, but their agents report seconds apart: the first
    tray decided alone would be a healthy machine evicted. Once the others report, the domain incident explains them
    all; if none does, the tray is decided a few seconds later."""
    settle = settings.nvlink_domain_settle_s
    if not settings.nvlink_domains_enabled or settle <= 0:
        return set()
    first: dict[str, datetime] = {}
    for node, category, seen in findings:
        if category == "nvlink":
            first[node] = min(first.get(node, seen), seen)
    young = {node for node, seen in first.items() if seen > now - timedelta(seconds=settle)}
    if not young:
        return set()
    return set(
        session.scalars(
            select(Node.name)
            .join(Gpu, Gpu.node_id == Node.id)
            .where(Node.name.in_(young), Gpu.fabric_cluster_uuid.is_not(None))
            .distinct()
        )
    )


def membership(session: Session, *, node_ids: Collection[int]) -> dict[int, tuple[str, int | None]]:
    """Node id -> (its NVLink domain, its clique), for the nodes in one (the clique most of its GPUs are in)."""
    if not node_ids:
        return {}
    rows = session.execute(
        select(Gpu.node_id, Gpu.fabric_cluster_uuid, Gpu.fabric_clique_id, func.count())
        .where(Gpu.node_id.in_(list(node_ids)), Gpu.fabric_cluster_uuid.is_not(None))
        .group_by(Gpu.node_id, Gpu.fabric_cluster_uuid, Gpu.fabric_clique_id)
        .order_by(Gpu.node_id, func.count().desc(), Gpu.fabric_cluster_uuid)
    ).all()
    out: dict[int, tuple[str, int | None]] = {}
    for node_id, cluster, clique, _ in rows:
        out.setdefault(node_id, (cluster, clique))
    return out
