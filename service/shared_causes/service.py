"""Shared-cause incidents: one component several nodes share (a leaf switch, a rack, a driver version, a storage
mount...) blamed for their findings at once, decided for the component rather than node by node.

The contract other domains build on (helper code for NVLink domains opens its incidents through it too):
- `open_or_update`: the component's one open incident, created or joined by more members (idempotent).
- `decide_for_component`: a `cordon` decision per member (no new work placed there; running work is not killed),
  each linked to the shared incident, through the fleet circuit breaker, and one chat notification per incident; a
  member under planned maintenance or silenced is spared its cordon.
- `explained_members` and `is_explained`: whether a node's finding of a category is explained by an open shared
  incident, so per-node diagnosis decides no eviction for it (a node with evidence of another category keeps its
  own).
Functions flush; the caller's request or task commits.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text, true, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ml.shared_causes import SHARED_CATEGORIES, NodeFinding, Params, Rival, SharedGroup, against_rivals, detect
from service.breaker import service as breaker
from service.config import Settings
from service.decisions.schemas import DecisionOut
from service.errors import NotFound
from service.incidents import service as incidents
from service.models import Decision, Finding, Incident, Job, Node, SharedIncident, Silence
from service.models.shared_causes import COMPONENT_KINDS
from service.nodes import lifecycle as node_lifecycle
from service.notify import service as notify
from service.pagination import decode_cursor, encode_cursor
from service.planned import service as planned
from service.schemas import Joined
from service.shared_causes.schemas import SharedIncidentDetail, SharedIncidentOut, SharedIncidentPage
from service.silences import service as silences

SYSTEM_ACTOR = node_lifecycle.SYSTEM_ACTOR
# What a component's failure does to the jobs on its nodes, whatever the component: their other ranks time out
# waiting (victims with no cause of their own), the job hangs.
CONSEQUENCES = frozenset({"job_failure", "hang"})
# Per-node decisions still waiting for a scheduler that a shared incident supersedes for its members.
_SUPERSEDED_KINDS = ("evict", "diagnose", "reset_gpu")
_WAITING = ("pending", "awaiting_approval")


def open_or_update(
    session: Session,
    *,
    component_kind: str,
    component: str,
    node_ids: Iterable[int],
    summary: str,
    evidence: Mapping[str, Any],
    now: datetime,
) -> SharedIncident:
    """The component's open shared incident with these nodes among its members, opened if there is none.

    Idempotent and race-free (a partial unique index keeps one open incident per component): a second call adds the
    nodes not yet members (each with when it joined), merges the evidence (its `categories` as a union) and moves
    `updated_at`; it never opens a second incident. The row comes back locked for the rest of the transaction."""
    if component_kind not in COMPONENT_KINDS:
        raise ValueError(f"unknown component kind {component_kind!r}; expected one of {', '.join(COMPONENT_KINDS)}")
    if not component:
        raise ValueError("a shared incident needs its component's name")
    for _ in range(3):
        session.execute(
            insert(SharedIncident)
            .values(
                component_kind=component_kind,
                component=component[:500],
                summary=summary[:1000],
                members=[],
                evidence={},
                opened_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["component_kind", "component"], index_where=text("state = 'open'"))
        )
        incident = session.scalar(
            select(SharedIncident)
            .where(
                SharedIncident.component_kind == component_kind,
                SharedIncident.component == component[:500],
                SharedIncident.state == "open",
            )
            .with_for_update()
        )
        if incident is not None:
            break
        # Resolved between the insert and the read (the beat's quiet resolution): open it again.
    else:
        raise RuntimeError(f"no open shared incident for {component_kind} {component} after three tries")
    ids = sorted(set(node_ids))
    known = {m.get("node_id") for m in incident.members or []}
    joining = [i for i in ids if i not in known]
    if joining:
        names = dict(session.execute(select(Node.id, Node.name).where(Node.id.in_(joining))).all())
        incident.members = [
            *(incident.members or []),
            *({"node_id": i, "node": names.get(i), "joined_at": now.isoformat()} for i in joining if i in names),
        ]
    incident.evidence = _merged(incident.evidence or {}, evidence)
    incident.summary = summary[:1000]
    incident.updated_at = max(incident.updated_at or now, now)
    session.flush()
    return incident


def _merged(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The evidence so far with the new on top; the categories it explains only grow."""
    categories = sorted({*old.get("categories", []), *new.get("categories", [])})
    return {**old, **new, "categories": categories}


def decide_for_component(
    session: Session, *, incident: SharedIncident, now: datetime, settings: Settings
) -> list[Decision]:
    """The component's decision: a `cordon` per member not yet cordoned for this incident (schedulers place no new
    work there; running work is not killed), each linked to the incident; the member's per-node evictions still
    waiting for a scheduler on the shared cause's categories are superseded; chat hears of it once per incident.

    A member under planned maintenance or silenced right now gets no cordon, as a silenced node gets no decision of
    its own; the incident's evidence says why (`spared`), and a later call cordons it once that is over. The fleet
    circuit breaker admits the cordons as it does every automatic take-out (service/breaker/): those over its limit
    wait for a person (guard rail `fleet_breaker`) and leave their node in service.

    In shadow mode the cordons are recorded, never acted on; in approval mode they wait for a person. Returns the
    decisions this call made (none when every member has its cordon already)."""
    members = {int(m["node_id"]): m.get("node") for m in incident.members or [] if m.get("node_id") is not None}
    if not members:
        return []
    have = set(
        session.scalars(
            select(Decision.node_id).where(Decision.shared_incident_id == incident.id, Decision.kind == "cordon")
        )
    )
    waiting = {i: str(members[i]) for i in sorted(set(members) - have) if members[i]}
    spared = _spared(session, names=list(waiting.values()), now=now, settings=settings)
    if spared != incident.evidence.get("spared", {}):
        incident.evidence = {**incident.evidence, "spared": spared}
    new = [i for i in waiting if waiting[i] not in spared]
    state, mode = _state(settings)
    if state == "pending" and new:
        # Nodes before the breaker's row, the order the per-node path takes them in (no deadlock between the two).
        node_lifecycle.lock(session, names=[waiting[i] for i in new])
        words = breaker.admit(session, candidates=[("cordon", waiting[i]) for i in new], now=now, settings=settings)
    else:
        words = [breaker.Admission(True, "") for _ in new]
    made: list[Decision] = []
    held: set[int] = set()
    what = f"{incident.component_kind} {incident.component}"
    for node_id, word in zip(new, words, strict=True):
        rails = {"shared_cause": f"one decision for {what}: no new work on its nodes", **mode}
        if word.rail:
            rails[breaker.RAIL] = word.rail
        values = {
            "node_id": node_id,
            "shared_incident_id": incident.id,
            "kind": "cordon",
            "state": state if word.admitted else "awaiting_approval",
            "confidence": float(incident.evidence.get("confidence", 1.0)),
            "reason": f"cordon {waiting[node_id]}: shared cause {what} (shared incident {incident.id}): "
            f"{incident.summary}"[:1000],
            "evidence": {
                "shared_incident_id": incident.id,
                "component_kind": incident.component_kind,
                "component": incident.component,
                "categories": incident.evidence.get("categories", []),
                "guard_rails": rails,
            },
            "created_at": now,
            "expires_at": now + timedelta(seconds=settings.decision_ttl_s),
        }
        decision_id = session.scalar(
            insert(Decision)
            .values(**values)
            .on_conflict_do_nothing(
                index_elements=["shared_incident_id", "kind", "node_id"],
                index_where=text("shared_incident_id IS NOT NULL"),
            )
            .returning(Decision.id)
        )
        if decision_id is not None:
            made.append(session.get_one(Decision, decision_id))
            if not word.admitted:
                held.add(node_id)
    if state != "shadow":
        # A cordon the breaker held leaves its node as it is: automation has stopped, a person decides.
        out = [d.node_id for d in made if d.node_id is not None and d.node_id not in held]
        if out:
            _hold_out(session, incident=incident, node_ids=out, now=now)
    _supersede(session, incident=incident, node_ids=list(members), now=now)
    _close_member_incidents(session, incident=incident, names=[n for n in members.values() if n], now=now)
    _announce(session, incident=incident, decisions=made, held=[waiting[i] for i in new if i in held], now=now)
    session.flush()
    return made


def _spared(session: Session, *, names: Sequence[str], now: datetime, settings: Settings) -> dict[str, str]:
    """Node -> why no cordon: of these members, those an announced maintenance window or a silence covers now."""
    if not names:
        return {}
    spans = planned.maintenance_spans(session, since=now, until=now, settings=settings)
    active = silences.active_silences(session, now=now)
    if not spans and not active:
        return {}
    jobs = dict(
        session.execute(
            select(Node.name, Job.external_id).join(Job, Job.id == Node.current_job_id).where(Node.name.in_(names))
        ).all()
    )
    spared = {n: _covered(n, at=now, job=jobs.get(n), spans=spans, active=active) for n in names}
    return {n: why for n, why in spared.items() if why is not None}


def _covered(
    node: str, *, at: datetime, job: str | None, spans: dict[str, list[planned.Span]], active: Sequence[Silence]
) -> str | None:
    """Why a member gets no cordon at `at` (None: it gets one): inside a planned maintenance window (its going down
    is the maintenance), or covered by a silence active now (as diagnosis treats a silenced node: its findings are
    kept, nothing is decided or held against it)."""
    span = planned.covering(spans, node=node, at=at)
    if span is not None:
        return f"planned maintenance (window {span.window_id})"
    silence = silences.covering(active, job=job, nodes=[node])
    return f"silenced (silence {silence.id})" if silence is not None else None


def _state(settings: Settings) -> tuple[str, dict[str, str]]:
    """The cordons' state under the policy's mode, and the guard rail that says so."""
    if settings.policy_mode == "shadow":
        return "shadow", {"mode": "shadow: recorded, never acted on"}
    if settings.policy_mode == "approval":
        return "awaiting_approval", {"mode": "approval required"}
    return "pending", {}


def _hold_out(session: Session, *, incident: SharedIncident, node_ids: Collection[int], now: datetime) -> None:
    """Members in service move to `cordoned` (a node already out of service keeps its state), in their history."""
    reason = f"shared incident {incident.id}: {incident.component_kind} {incident.component}"
    names = session.scalars(select(Node.name).where(Node.id.in_(node_ids)))
    for node in node_lifecycle.lock(session, names=names):
        if node.state in node_lifecycle.CORDON_FROM:
            node_lifecycle.record(
                session,
                node=node,
                kind="cordon",
                source="diagnosis",
                actor=SYSTEM_ACTOR,
                now=now,
                to_state="cordoned",
                reason=reason,
                details={"shared_incident_id": incident.id},
            )


def _supersede(session: Session, *, incident: SharedIncident, node_ids: Collection[int], now: datetime) -> None:
    """Per-node decisions still waiting on a member, from its incidents of the shared cause's categories, are
    rejected: the component is to blame, not the node (decisions on other evidence stand)."""
    categories = list(incident.evidence.get("categories", []))
    if not categories or not node_ids:
        return
    _reject_waiting(
        session,
        Decision.node_id.in_(node_ids),
        Decision.kind.in_(_SUPERSEDED_KINDS),
        Decision.incident_id.in_(select(Incident.id).where(Incident.root_cause.in_(categories))),
        message=f"superseded: explained by shared incident {incident.id} "
        f"({incident.component_kind} {incident.component})",
        now=now,
    )


def _reject_waiting(session: Session, *where: Any, message: str, now: datetime) -> None:
    """Decisions matching `where` still waiting for a scheduler are rejected by the system, with `message`."""
    session.execute(
        update(Decision)
        .where(Decision.state.in_(_WAITING), *where)
        .values(state="rejected", outcome="rejected", outcome_message=message[:1000], acked_at=now, actor=SYSTEM_ACTOR)
        .execution_options(synchronize_session=False)
    )


def _close_member_incidents(session: Session, *, incident: SharedIncident, names: list[str], now: datetime) -> None:
    """A member's own incident on the shared cause's categories, opened before the group formed, resolves: its
    findings are the component's (diagnosis leaves them out of the job's incidents from now on)."""
    categories = list(incident.evidence.get("categories", []))
    if not categories or not names:
        return
    rows = session.scalars(
        select(Incident).where(
            Incident.state != "resolved", Incident.anchor.in_(names), Incident.root_cause.in_(categories)
        )
    ).all()
    what = f"{incident.component_kind} {incident.component}"
    for row in rows:
        incidents.resolve(
            session, incident=row, resolution=f"explained by shared incident {incident.id} ({what})", now=now
        )


def _announce(
    session: Session, *, incident: SharedIncident, decisions: list[Decision], held: list[str], now: datetime
) -> None:
    """One chat message per shared incident (keyed: a later member joining does not post again)."""
    if not decisions:
        return
    names = [m.get("node") for m in incident.members or []]
    spared = incident.evidence.get("spared", {})
    cordoned = [str(n) for n in names if n not in held and n not in spared]
    summary = f"{incident.summary} Cordoned from new work: {', '.join(cordoned) or 'none'}."
    if held:
        summary += f" Held for a person by the fleet breaker: {', '.join(held)}."
    if spared:
        summary += f" Not cordoned (maintenance or silenced): {', '.join(sorted(spared))}."
    notify.record_fleet_event(
        session,
        event="shared_cause",
        key=f"shared:{incident.id}:opened",
        payload={
            "title": f"Shared cause #{incident.id}: {incident.component_kind} {incident.component} "
            f"({len(names)} nodes)",
            "summary": summary,
            "shared_incident_id": incident.id,
            "component_kind": incident.component_kind,
            "component": incident.component,
            "nodes": names,
        },
        path=f"/shared-incidents/{incident.id}",
        now=now,
    )


def detect_and_decide(session: Session, *, now: datetime, settings: Settings) -> list[Decision]:
    """Group the fleet's recent findings by the components their nodes share (ml/shared_causes.py); each group opens
    or joins its component's shared incident, which is decided for the component. Returns the decisions made.

    Reads the cause findings of every job observed within the window (a switch's nodes run different jobs) and the
    labels of every node (the base rate: how many nodes share each value)."""
    if not settings.shared_causes_enabled:
        return []
    window = timedelta(seconds=settings.shared_cause_window_s)
    rows = session.execute(
        select(Finding.id, Node.name, Finding.category, Finding.observed_at, Finding.evidence)
        .outerjoin(Node, Node.id == Finding.node_id)
        .where(
            # created_at (the database's clock) bounds the scan by its index; observed_at (the evidence's) decides.
            # A pass on a clock ahead of the database's (a test, a replay) bounds it by the database's own.
            Finding.created_at >= func.least(now, func.now()) - 2 * window,
            # A node's clock may run ahead of the pass's (observed_at is the node's): a window either side.
            Finding.observed_at >= now - window,
            Finding.observed_at <= now + window,
            Finding.role == "cause",
            Finding.category.in_(sorted(SHARED_CATEGORIES)),
        )
    ).all()
    # Findings a resolved shared incident explains (the links of a replaced switch coming back up) are its
    # aftermath: they open no second incident for the component.
    # (An open incident's findings stay in: they join its group again, and a rival group over them is weighed
    # against it below.)
    closed = [e for e in explained_members(session, now=now) if e.resolved]
    found = [
        (finding_id, node, category, observed_at)
        for finding_id, name, category, observed_at, evidence in rows
        if not is_explained(closed, node=name, category=category, observed_at=observed_at, evidence=evidence)
        for node in ([name] if name else _nodes_cited(evidence))
    ]
    if len({f[1] for f in found}) < 2:
        return []  # one node (the normal case): nothing shared to look for
    # A node down for announced maintenance (a rack's planned power work) is no member failing: its findings are
    # the maintenance, kept for the record but counted for no component. A silence is not: it mutes what faultline
    # says and does about a node, not what its findings show (a silenced node behind a failed switch is one of the
    # switch's members, spared its cordon by decide_for_component).
    spans = planned.maintenance_spans(session, since=now - window, until=now + window, settings=settings)
    findings = [
        NodeFinding(node, category, observed_at, finding_id)
        for finding_id, node, category, observed_at in found
        if planned.covering(spans, node=node, at=observed_at) is None
    ]
    if len({f.node for f in findings}) < 2:
        return []
    labels = {
        name: node_labels
        for name, node_labels in session.execute(select(Node.name, Node.labels).where(Node.labels.is_not(None)))
    }
    params = Params(
        window_s=settings.shared_cause_window_s,
        min_nodes=settings.shared_cause_min_nodes,
        min_share=settings.shared_cause_min_share,
        min_lift=settings.shared_cause_min_lift,
    )
    node_of: dict[int, set[str]] = {}
    for f in findings:
        if f.finding_id is not None:
            node_of.setdefault(f.finding_id, set()).add(f.node)
    made: list[Decision] = []
    for found_group in detect(findings, labels, params):
        if _resolved_since(session, group=found_group):
            continue
        group, superseded = against_rivals(found_group, _rivals(session), node_of, params.min_nodes)
        if group is None:
            continue
        ids = list(session.scalars(select(Node.id).where(Node.name.in_(group.nodes))))
        incident = open_or_update(
            session,
            component_kind=group.component_kind,
            component=group.component,
            node_ids=ids,
            summary=group.summary,
            evidence=group.evidence(),
            now=now,
        )
        _supersede_rivals(session, ids=superseded, by=incident, now=now)
        made += decide_for_component(session, incident=incident, now=now, settings=settings)
    return made


def _rivals(session: Session) -> list[Rival]:
    """The open shared incidents and the findings each claims (read per group: one may have just been superseded)."""
    return [
        Rival(
            i.id,
            i.component_kind,
            i.component,
            frozenset((i.evidence or {}).get("finding_ids", [])),
            len(i.members or []),
        )
        for i in session.scalars(select(SharedIncident).where(SharedIncident.state == "open"))
    ]


def _supersede_rivals(session: Session, *, ids: Sequence[int], by: SharedIncident, now: datetime) -> None:
    """Open incidents of another component that a group over more nodes explains better resolve, pointing at it;
    their cordons still waiting are withdrawn (one carried out stays: the node is out, a person or the return gate
    brings it back)."""
    if not ids:
        return
    what = f"{by.component_kind} {by.component}"
    for rival in session.scalars(select(SharedIncident).where(SharedIncident.id.in_(ids)).with_for_update()):
        _resolve(
            rival,
            resolution=f"superseded by shared incident {by.id} ({what}): the same findings on more nodes",
            now=now,
        )
    _reject_waiting(
        session,
        Decision.shared_incident_id.in_(ids),
        Decision.kind == "cordon",
        message=f"superseded: shared incident {by.id} ({what}) explains its findings",
        now=now,
    )


def _nodes_cited(evidence: Mapping[str, Any] | None) -> list[str]:
    """The nodes a job-wide finding cites (a storage error on every node is one finding of the job)."""
    nodes = (evidence or {}).get("nodes")
    return [str(n) for n in nodes if n] if isinstance(nodes, list) else []


def _resolved_since(session: Session, *, group: SharedGroup) -> bool:
    """Whether the component's last shared incident was resolved after this evidence began: a person closed it
    (or it went quiet) on the same findings, which do not open it again."""
    resolved = session.scalar(
        select(func.max(SharedIncident.resolved_at)).where(
            SharedIncident.component_kind == group.component_kind,
            SharedIncident.component == group.component,
            SharedIncident.state == "resolved",
        )
    )
    return resolved is not None and resolved >= group.first_at


def resolve_quiet(session: Session, *, now: datetime, quiet_s: float) -> list[int]:
    """Open shared incidents with no new evidence for `quiet_s` resolve (their members stay cordoned until a person
    or the return gate puts them back: a repaired switch is a person's word). Returns their ids."""
    rows = session.scalars(
        select(SharedIncident)
        .where(SharedIncident.state == "open", SharedIncident.updated_at < now - timedelta(seconds=quiet_s))
        .with_for_update(skip_locked=True)
    ).all()
    for incident in rows:
        _resolve(incident, resolution=f"quiet: no new evidence for {quiet_s:.0f} s", now=now)
    session.flush()
    return [i.id for i in rows]


def resolve_by_hand(session: Session, *, incident_id: int, reason: str, actor: str, now: datetime) -> SharedIncident:
    """A person says the component is repaired. Idempotent; a resolved incident stays as it was."""
    incident = session.scalar(select(SharedIncident).where(SharedIncident.id == incident_id).with_for_update())
    if incident is None:
        raise NotFound(f"no shared incident {incident_id}")
    if incident.state == "open":
        _resolve(incident, resolution=f"resolved by {actor}: {reason}", now=now)
        session.flush()
    return incident


def _resolve(incident: SharedIncident, *, resolution: str, now: datetime) -> None:
    incident.state = "resolved"
    incident.resolved_at = now
    incident.updated_at = max(incident.updated_at, now)
    incident.resolution = resolution[:500]


# ---- reading ----


def get(session: Session, *, incident_id: int) -> SharedIncidentDetail:
    """One shared incident with its cordons."""
    incident = session.get(SharedIncident, incident_id)
    if incident is None:
        raise NotFound(f"no shared incident {incident_id}")
    rows = session.execute(
        select(Decision, Node.name)
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(Decision.shared_incident_id == incident_id)
        .order_by(Decision.id)
    ).all()
    decisions = [DecisionOut.model_validate(Joined(d, job_id=None, node=n)) for d, n in rows]
    return SharedIncidentDetail.model_validate(Joined(incident, decisions=decisions))


def list_incidents(
    session: Session,
    *,
    state: str | None = None,
    component_kind: str | None = None,
    node: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> SharedIncidentPage:
    """Newest first, keyset-paginated on id; `node` matches a part of a member's name."""
    query = select(SharedIncident).order_by(SharedIncident.id.desc())
    if state:
        query = query.where(SharedIncident.state == state)
    if component_kind:
        query = query.where(SharedIncident.component_kind == component_kind)
    if node:
        member = func.jsonb_array_elements(SharedIncident.members).table_valued("value").alias("member")
        query = query.where(
            select(true())
            .select_from(member)
            .where(member.c.value.op("->>")("node").icontains(node, autoescape=True))
            .exists()
        )
    if cursor:
        query = query.where(SharedIncident.id < decode_cursor(cursor))
    rows = session.scalars(query.limit(limit + 1)).all()
    return SharedIncidentPage(
        items=[SharedIncidentOut.model_validate(r) for r in rows[:limit]],
        next_cursor=encode_cursor(rows[limit - 1].id) if len(rows) > limit else None,
    )


def open_count(session: Session) -> int:
    """How many shared incidents are open (the overview's banner)."""
    return session.scalar(select(func.count()).where(SharedIncident.state == "open")) or 0


@dataclass(frozen=True, slots=True)
class OpenShared:
    """What every UI page's banner says while shared incidents are open: how many, and the newest few."""

    count: int
    newest: list[SharedIncidentOut]


def open_banner(session: Session, *, show: int = 3) -> OpenShared | None:
    """The banner's facts when shared incidents are open, else None: one small query while none is."""
    rows = session.scalars(
        select(SharedIncident).where(SharedIncident.state == "open").order_by(SharedIncident.id.desc()).limit(show)
    ).all()
    if not rows:
        return None
    count = len(rows) if len(rows) < show else open_count(session)
    return OpenShared(count, [SharedIncidentOut.model_validate(r) for r in rows])


@dataclass(frozen=True, slots=True)
class Membership:
    """One shared incident a node is a member of, and what it meant for the node."""

    incident: SharedIncidentOut
    joined_at: datetime | None
    cordon: DecisionOut | None  # the component's cordon of this node; None while spared (maintenance, a silence)
    spared: str | None  # why it got no cordon


def _joined(incident: SharedIncident, node_id: int) -> datetime | None:
    joined = next((m.get("joined_at") for m in incident.members or [] if m.get("node_id") == node_id), None)
    return datetime.fromisoformat(joined) if joined else None


def memberships(session: Session, *, name: str, limit: int = 10) -> list[Membership]:
    """The shared incidents the node is a member of, open ones first, then the newest (404 for an unknown node)."""
    node_id = session.scalar(select(Node.id).where(Node.name == name))
    if node_id is None:
        raise NotFound(f"no node {name!r}")
    rows = session.scalars(
        select(SharedIncident)
        .where(SharedIncident.members.contains([{"node_id": node_id}]))
        .order_by((SharedIncident.state == "open").desc(), SharedIncident.id.desc())
        .limit(limit)
    ).all()
    cordons = {
        d.shared_incident_id: DecisionOut.model_validate(Joined(d, job_id=None, node=name))
        for d in session.scalars(
            select(Decision).where(
                Decision.node_id == node_id,
                Decision.kind == "cordon",
                Decision.shared_incident_id.in_([r.id for r in rows]),
            )
        )
    }
    return [
        Membership(
            incident=SharedIncidentOut.model_validate(r),
            joined_at=_joined(r, node_id),
            cordon=cordons.get(r.id),
            spared=(r.evidence or {}).get("spared", {}).get(name) if r.id not in cordons else None,
        )
        for r in rows
    ]


@dataclass(frozen=True, slots=True)
class Explained:
    """What one shared incident explains: findings of these categories on these nodes, observed from a window before
    it opened until two minutes after it resolved (open: a window after its group was last seen)."""

    categories: frozenset[str]
    members: frozenset[str]
    since: datetime
    until: datetime | None
    resolved: bool = False


# A resolved shared incident still explains its findings for as long as diagnosis may read them back (an hour in
# production, FINDING_HORIZON; longer where the pass's clock runs behind the database's, as in the lab's campaign).
_EXPLAINS_AFTER_RESOLVED = timedelta(hours=24)
_AFTERMATH = timedelta(minutes=2)


def explained_members(session: Session, *, now: datetime) -> list[Explained]:
    """The shared incidents open, or resolved within the last hour, and what each explains: diagnosis leaves those
    findings out of the job's own incidents (a switch replaced and its incident closed, the IB errors it caused are
    still its own, not a new incident of the job's). One small query per pass."""
    rows = session.execute(
        select(
            SharedIncident.members,
            SharedIncident.evidence,
            SharedIncident.opened_at,
            SharedIncident.resolved_at,
            SharedIncident.updated_at,
        ).where(
            SharedIncident.opened_at <= now,
            (SharedIncident.state == "open") | (SharedIncident.resolved_at >= now - _EXPLAINS_AFTER_RESOLVED),
        )
    ).all()
    return [
        Explained(
            categories=frozenset((evidence or {}).get("categories", [])),
            members=frozenset(str(m["node"]) for m in members or [] if m.get("node")),
            # The window before it opened: the first findings of the group came that long before.
            since=opened_at - _window_of(evidence),
            # Evidence read a pass or two after the repair (a counter's window judged late, the links coming back up)
            # is still the component's; a failure after that is a new one.
            # While open, as long as its group keeps being seen (each sighting moves updated_at): a member's lone
            # fault long after is its own, not the component's.
            until=resolved_at + _AFTERMATH if resolved_at is not None else updated_at + _window_of(evidence),
            resolved=resolved_at is not None,
        )
        for members, evidence, opened_at, resolved_at, updated_at in rows
    ]


def _window_of(evidence: Mapping[str, Any] | None) -> timedelta:
    first, last = (evidence or {}).get("first_at"), (evidence or {}).get("last_at")
    try:
        spread = datetime.fromisoformat(last) - datetime.fromisoformat(first) if first and last else timedelta(0)
    except (TypeError, ValueError):
        spread = timedelta(0)
    return max(spread, timedelta(minutes=10))


def is_explained(
    explained: Sequence[Explained],
    *,
    node: str | None,
    category: str,
    observed_at: datetime,
    evidence: Mapping[str, Any] | None,
    job_nodes: Collection[str] = (),
) -> bool:
    """Whether a finding is a shared cause's: of a category it explains, observed while it held, on a member; a
    job-wide one (a storage error on every node) when every node it cites is a member. A job's victims (its other
    ranks timing out, its hang) are the component's too when some of the job's nodes are its members."""
    cited = [node] if node else _nodes_cited(evidence)
    for e in explained:
        if not (e.since <= observed_at and (e.until is None or observed_at <= e.until)):
            continue
        if category in e.categories and cited and set(cited) <= e.members:
            return True
        if category in CONSEQUENCES and not e.members.isdisjoint(job_nodes):
            return True
    return False
