"""A node's failures over time: its earlier incidents of the same kind, and whether they hit the same GPU.

"The same GPU fell off the bus 9 minutes ago" is what turns a reset or an eviction into a repair ticket, and what an
escalation ladder reads. An incident is the node's when the node is its anchor (a machine fault's incident), its
top suspect, or was acted on for it (an eviction or a GPU reset acknowledged: a `node_events` row of the incident
that is not a mere suspicion). Its GPUs are the GPU subjects of its findings on the node, by index where the
inventory knows the PCI address a kernel line gave. Merged-away incidents repeat another one and are left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from service.gpu_names import by_address, kernel_pci
from service.models import Finding, Gpu, Incident, Job, Node, NodeEvent

MAX_INCIDENTS = 200  # of one node (or one incident's nodes) within the window: more is a lemon, shown as such
# node_events that only say a node was named, not that anything failed on it or was done to it.
_NAMED_ONLY = ("suspect", "cleared", "lemon")


@dataclass(frozen=True)
class PastIncident:
    id: int
    job_id: str
    root_cause: str
    summary: str | None
    opened_at: datetime
    resolved_at: datetime | None
    resolution: str | None
    node: str
    gpus: tuple[str, ...]  # the node's GPUs its findings name: "7" (an index), or an address the inventory lacks


@dataclass(frozen=True)
class Repeat:
    """An earlier incident of the same root cause on one of this incident's nodes."""

    earlier: PastIncident
    same_gpu: str | None  # the GPU both name, when they do
    before_s: float  # how long before this incident it opened


@dataclass
class RepeatGroup:
    """A node's incidents of one root cause within the window: a repeat failure when there are two or more."""

    root_cause: str
    incidents: list[PastIncident]  # newest first
    gpus: list[str] = field(default_factory=list)  # GPUs named by two or more of them


@dataclass(frozen=True)
class _Row:
    """What the rule needs of an incident: the ORM row's or a caller's own."""

    id: int
    job_id: str
    root_cause: str
    summary: str | None
    opened_at: datetime
    resolved_at: datetime | None
    resolution: str | None
    anchor: str
    top: str | None  # its top suspect

    @classmethod
    def of(cls, incident: Incident, job_id: str) -> _Row:
        top = incident.suspects[0].get("node") if incident.suspects else None
        return cls(
            incident.id,
            job_id,
            incident.root_cause,
            incident.summary,
            incident.opened_at,
            incident.resolved_at,
            incident.resolution,
            incident.anchor,
            top,
        )


def _gpu_key(subject: str, addresses: dict[tuple[str, str], int], node: str) -> str | None:
    _, _, gpu = subject.rpartition("/")
    if gpu.isdigit():
        return gpu
    pci = kernel_pci(gpu)
    if pci is None:
        return None
    index = addresses.get((node, pci))
    return str(index) if index is not None else pci


def _query(
    *,
    names: Collection[str],
    since: datetime,
    until: datetime,
    root_cause: str | None = None,
    exclude: Collection[int] = (),
) -> Select[tuple[Incident, str]]:
    """The incidents of these nodes opened in [since, until), newest first (with their job's external id)."""
    node_ids = select(Node.id).where(Node.name.in_(list(names)))
    acted = select(NodeEvent.incident_id).where(
        NodeEvent.node_id.in_(node_ids), NodeEvent.incident_id.is_not(None), NodeEvent.kind.not_in(_NAMED_ONLY)
    )
    query = (
        select(Incident, Job.external_id)
        .join(Job, Job.id == Incident.job_id)
        .where(
            or_(
                Incident.anchor.in_(list(names)),
                Incident.suspects[0]["node"].astext.in_(list(names)),
                Incident.id.in_(acted.where(NodeEvent.at >= since)),
            ),
            Incident.opened_at >= since,
            Incident.opened_at < until,
            or_(Incident.resolution.is_(None), ~Incident.resolution.startswith("merged")),
        )
        .order_by(Incident.opened_at.desc(), Incident.id.desc())
        .limit(MAX_INCIDENTS)
    )
    if root_cause is not None:
        query = query.where(Incident.root_cause == root_cause)
    if exclude:
        query = query.where(Incident.id.not_in(list(exclude)))
    return query


def _describe(session: Session, *, rows: Sequence[_Row], names: Collection[str]) -> list[PastIncident]:
    """Each incident once per node of `names` it concerns, with the GPUs its findings name there: three queries."""
    if not rows:
        return []
    ids = [r.id for r in rows]
    events = session.execute(
        select(NodeEvent.incident_id, Node.name)
        .join(Node, Node.id == NodeEvent.node_id)
        .where(NodeEvent.incident_id.in_(ids), Node.name.in_(list(names)), NodeEvent.kind.not_in(_NAMED_ONLY))
    ).all()
    findings = session.execute(
        select(Finding.incident_id, Node.name, Finding.subject)
        .join(Node, Node.id == Finding.node_id)
        .where(Finding.incident_id.in_(ids), Node.name.in_(list(names)), Finding.subject_kind == "gpu")
    ).all()
    inventory = session.execute(
        select(Node.name, Gpu.index, Gpu.pci_bus_id).join(Gpu, Gpu.node_id == Node.id).where(Node.name.in_(list(names)))
    ).all()
    addresses = by_address(inventory)
    acted_on: dict[int, set[str]] = defaultdict(set)
    for incident_id, name in events:
        acted_on[incident_id].add(name)
    gpus: dict[tuple[int, str], set[str]] = defaultdict(set)
    for incident_id, name, subject in findings:
        if (key := _gpu_key(subject, addresses, name)) is not None:
            gpus[(incident_id, name)].add(key)
    out = []
    for r in rows:
        for name in sorted({r.anchor, r.top, *acted_on[r.id]} & set(names)):
            out.append(
                PastIncident(
                    id=r.id,
                    job_id=r.job_id,
                    root_cause=r.root_cause,
                    summary=r.summary,
                    opened_at=r.opened_at,
                    resolved_at=r.resolved_at,
                    resolution=r.resolution,
                    node=name,
                    gpus=tuple(sorted(gpus[(r.id, name)], key=lambda g: (not g.isdigit(), g.zfill(8)))),
                )
            )
    return out


def earlier_incidents(
    session: Session,
    *,
    names: Collection[str],
    since: datetime,
    until: datetime,
    root_cause: str | None = None,
    exclude: Collection[int] = (),
) -> list[PastIncident]:
    """The incidents of these nodes opened in [since, until) (of `root_cause` if given), newest first, each once per
    node it concerns: what an escalation reads. Four queries, however many; one when there are none."""
    if not names:
        return []
    query = _query(names=names, since=since, until=until, root_cause=root_cause, exclude=exclude)
    rows = [_Row.of(i, j) for i, j in session.execute(query).all()]
    return _describe(session, rows=rows, names=names)


def repeats_of(
    session: Session,
    *,
    incident_id: int,
    root_cause: str,
    opened_at: datetime,
    anchor: str,
    suspects: Sequence[str],
    window_s: float,
) -> list[Repeat]:
    """An incident's repeat failures: earlier incidents of the same root cause on its nodes (its anchor, top suspect,
    or a node acted on for it) within `window_s` before it opened; those on the same GPU first, then the latest.
    The caller has the incident (`suspects`: its suspects' names, the top one first). One query when there are none
    (the common case), four when there are."""
    names = sorted({n for n in (anchor, *suspects) if n})
    if not names:
        return []
    query = _query(
        names=names,
        since=opened_at - timedelta(seconds=window_s),
        until=opened_at,
        root_cause=root_cause,
        exclude=[incident_id],
    )
    rows = [_Row.of(i, j) for i, j in session.execute(query).all()]
    if not rows:
        return []
    # This incident is read with them: its own nodes and GPUs, by the same rule, in the same queries.
    me = _Row(incident_id, "", root_cause, None, opened_at, None, None, anchor, suspects[0] if suspects else None)
    described = _describe(session, rows=[*rows, me], names=names)
    mine = {p.node: set(p.gpus) for p in described if p.id == incident_id}
    repeats = [
        Repeat(
            earlier=p,
            same_gpu=min(mine[p.node] & set(p.gpus), key=lambda g: g.zfill(8), default=None),
            before_s=(opened_at - p.opened_at).total_seconds(),
        )
        for p in described
        if p.id != incident_id and p.node in mine
    ]
    return sorted(repeats, key=lambda r: (r.same_gpu is None, r.before_s))


def repeat_failures(session: Session, *, name: str, now: datetime, window_s: float) -> list[RepeatGroup]:
    """The node's root causes with two or more incidents within `window_s` before now, the most repeated first;
    each with its incidents (newest first) and the GPUs named more than once."""
    since = now - timedelta(seconds=window_s)
    return group_repeats(earlier_incidents(session, names=[name], since=since, until=now + timedelta(seconds=1)))


def group_repeats(past: Sequence[PastIncident]) -> list[RepeatGroup]:
    """Incidents grouped by root cause, the groups of two or more, the most repeated (then the latest) first."""
    by_cause: dict[str, list[PastIncident]] = defaultdict(list)
    for p in past:
        by_cause[p.root_cause].append(p)
    groups = []
    for cause, items in by_cause.items():
        if len(items) < 2:
            continue
        counts: dict[str, int] = defaultdict(int)
        for p in items:
            for g in p.gpus:
                counts[g] += 1
        items = sorted(items, key=lambda p: (p.opened_at, p.id), reverse=True)
        groups.append(
            RepeatGroup(cause, items, sorted((g for g, n in counts.items() if n > 1), key=lambda g: g.zfill(8)))
        )
    return sorted(groups, key=lambda g: (-len(g.incidents), -g.incidents[0].opened_at.timestamp()))
