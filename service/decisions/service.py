"""Decisions: the policy's plans stored with their evidence chain, and read back for schedulers and people."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from ml.demarcation import IncidentProposal
from service.breaker import service as breaker
from service.config import Settings
from service.decisions import rejects
from service.decisions.policy import (
    INACTIVE,
    DecisionPlan,
    PolicyContext,
    PriorDecision,
    build_context,
    decide,
    prior_window,
)
from service.decisions.schemas import DecisionOut, DecisionPage
from service.errors import NotFound
from service.fleet import stages as repair_stages
from service.gpu_names import by_address, kernel_pci, name_gpus
from service.jobs import service as jobs
from service.models import Decision, Finding, Gpu, Incident, Job, Node, Rank
from service.nodes import ladder as node_ladder
from service.pagination import decode_cursor, encode_cursor
from service.schemas import Joined

_MAX_CHAIN_FINDINGS = 20
_MAX_CHAIN_SIGNALS = 10
# Resets that were not carried out (rejected, expired) count for no escalation; a failed one does (the GPU is
# still faulty), and so does a shadow one (so shadow mode shows what `act` would decide).
_NOT_RESET = ("rejected", "expired")


def decide_incident(
    session: Session,
    *,
    job: Job,
    incident: Incident,
    proposal: IncidentProposal,
    now: datetime,
    settings: Settings,
    skip_nodes: Collection[str] = (),
) -> list[Decision]:
    """Run the policy for one incident and store what it decides (once per incident, kind and node).

    Plans naming a node in `skip_nodes` (silenced) are dropped.
    """
    plans = decide(
        proposal, _context(session, job=job, incident=incident, proposal=proposal, now=now, settings=settings), settings
    )
    plans = [p for p in plans if p.node not in skip_nodes]
    if not plans:
        return []
    _through_breaker(session, plans, now=now, settings=settings)
    node_ids = dict(
        session.execute(select(Node.name, Node.id).where(Node.name.in_({p.node for p in plans if p.node}))).all()
    )
    chain = _evidence_chain(session, plans)
    # Reasons quote kernel lines ("GPU 0000:df:00"); people and the scheduler's tools count GPUs by index.
    gpu_indexes = by_address(
        session.execute(
            select(Node.name, Gpu.index, Gpu.pci_bus_id)
            .join(Gpu, Gpu.node_id == Node.id)
            .where(Node.name.in_(list(node_ids)))
        )
    )
    first = not repair_stages.has_decision(session, incident_id=incident.id)
    stored: list[Decision] = []
    for plan in plans:
        values = {
            "incident_id": incident.id,
            "job_id": job.id,
            "node_id": node_ids.get(plan.node) if plan.node else None,
            "kind": plan.kind,
            "gpu": plan.gpu,
            "gpu_pci": plan.gpu_pci,
            "state": plan.state,
            "confidence": plan.confidence,
            "reason": name_gpus(plan.reason, plan.node, gpu_indexes)[:1000],
            "evidence": {
                "incident_id": incident.id,
                "root_cause": proposal.root_cause,
                "blame": proposal.blame,
                "guard_rails": plan.guard_rails,
                "findings": [chain[i] for i in plan.finding_ids[:_MAX_CHAIN_FINDINGS] if i in chain],
                **({"ladder": plan.ladder} if plan.ladder else {}),
            },
            "expires_at": now + timedelta(seconds=settings.decision_ttl_s),
        }
        decision_id = session.scalar(insert(Decision).values(**values).on_conflict_do_nothing().returning(Decision.id))
        if decision_id is not None:
            stored.append(session.get_one(Decision, decision_id))
    if stored and first:
        repair_stages.incident_decided(incident, now=now)
    if stored and incident.state == "open":
        incident.state = "mitigating"
    return stored


def _through_breaker(session: Session, plans: list[DecisionPlan], *, now: datetime, settings: Settings) -> None:
    """The fleet circuit breaker's word on the plans about to go to schedulers (service/breaker/): one that would
    take too much of the fleet out waits for a person instead, with the breaker named among its guard rails."""
    going = [p for p in plans if p.state == "pending" and p.node]
    words = breaker.admit(session, candidates=[(p.kind, p.node or "") for p in going], now=now, settings=settings)
    for plan, word in zip(going, words, strict=True):
        if word.rail:
            plan.guard_rails[breaker.RAIL] = word.rail
        if not word.admitted:
            plan.state = "awaiting_approval"


def rejoined_after_eviction(session: Session, *, nodes: Collection[str]) -> dict[str, tuple[datetime, datetime]]:
    """Node -> (when its last eviction was carried out, when it last got ranks assigned after that), for each of
    these nodes a scheduler put back in a job after an eviction (its repair): from then on the machine starts
    afresh. Its eviction no longer holds it in cooldown (the demo's repaired node-001 lost a GPU and nothing was
    decided), and its old fault no longer explains what it shows (a repaired node-000's new NVLink fault was taken
    for the wake of the GPU it had lost before its repair)."""
    if not nodes:
        return {}
    evicted = dict(
        session.execute(
            select(Node.name, func.max(Decision.acked_at))
            .join(Decision, Decision.node_id == Node.id)
            .where(Node.name.in_(nodes), Decision.kind == "evict", Decision.state == "done")
            .group_by(Node.name)
        ).all()
    )
    placed = dict(
        session.execute(
            select(Node.name, func.max(Rank.updated_at))
            .join(Rank, Rank.node_id == Node.id)
            .where(Node.name.in_(list(evicted)))
            .group_by(Node.name)
        ).all()
    )
    return {
        node: (acked, placed[node])
        for node, acked in evicted.items()
        if acked is not None and node in placed and placed[node] > acked
    }


def _context(
    session: Session, *, job: Job, incident: Incident, proposal: IncidentProposal, now: datetime, settings: Settings
) -> PolicyContext:
    since = now - prior_window(settings)
    rows = session.execute(
        select(
            Decision.kind,
            Node.name,
            Decision.state,
            Decision.created_at,
            Decision.job_id,
            Decision.incident_id,
            Decision.acked_at,
        )
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(
            Decision.created_at >= since,
            Decision.state.not_in(INACTIVE),
            or_(Decision.kind == "evict", and_(Decision.job_id == job.id, Decision.node_id.is_(None))),
        )
    ).all()
    evicted = {node for kind, node, state, *_ in rows if kind == "evict" and state == "done" and node}
    rejoined = {node: placed for node, (_, placed) in rejoined_after_eviction(session, nodes=evicted).items()}
    prior = [
        PriorDecision(kind=kind, node=node, state=state, created_at=at, job_id=job_id, incident_id=incident_id)
        for kind, node, state, at, job_id, incident_id, acked in rows
        if not (kind == "evict" and state == "done" and node in rejoined and acked and rejoined[node] > acked)
    ]
    already = {
        (kind, node)
        for kind, node in session.execute(
            select(Decision.kind, Node.name)
            .outerjoin(Node, Node.id == Decision.node_id)
            .where(Decision.incident_id == incident.id)
        )
    }
    gpu_indexes, gpu_resets = _gpus(session, incident=incident, proposal=proposal, now=now, settings=settings)
    network = _network_rows(session, proposal)
    return build_context(
        now=now,
        job_id=job.id,
        incident_id=incident.id,
        job_nodes=len(jobs.node_ids(session, job=job)),
        prior=prior,
        network_events=network_times(network),
        network_fatal=network_fatal(network),
        network_broken=lone_broken_flaps(
            network,
            drops_since=lambda since: port_drops(session, since=since, settings=settings),
            now=now,
            settings=settings,
        ),
        already_decided=already,
        settings=settings,
        gpu_indexes=gpu_indexes,
        gpu_resets=gpu_resets,
        overruled=rejects.overruled(session, proposal=proposal, now=now, settings=settings),
        ladders=node_ladder.histories(session, names=[s.node for s in proposal.suspects], now=now, settings=settings)
        if settings.policy_ladder_enabled
        else None,
    )


def _gpus(
    session: Session, *, incident: Incident, proposal: IncidentProposal, now: datetime, settings: Settings
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], list[datetime]]]:
    """For suspects whose evidence is on one resettable GPU: that GPU's index, and its resets for other incidents
    within the window (this incident's own reset is the one being decided, not an earlier one).

    Resets are keyed by the GPU's PCI address, as suspects name it: a reset by PCI bus id directly, one by index
    through the inventory (which keeps every GPU a node ever reported). So a GPU reset by bus id before its node
    reported an inventory and again, later, by index counts as one GPU."""
    nodes = {s.node for s in proposal.suspects if s.reset_gpu is not None}
    if not nodes or not settings.policy_reset_gpu_enabled:
        return {}, {}
    indexes = by_address(
        session.execute(
            select(Node.name, Gpu.index, Gpu.pci_bus_id).join(Gpu, Gpu.node_id == Node.id).where(Node.name.in_(nodes))
        )
    )
    addresses = {(node, index): address for (node, address), index in indexes.items()}
    resets: dict[tuple[str, str], list[datetime]] = defaultdict(list)
    since = now - timedelta(seconds=settings.policy_reset_gpu_window_s)
    for node, gpu, pci, created_at in session.execute(
        select(Node.name, Decision.gpu, Decision.gpu_pci, Decision.created_at)
        .join(Node, Node.id == Decision.node_id)
        .where(
            Decision.kind == "reset_gpu",
            Node.name.in_(nodes),
            Decision.created_at >= since,
            Decision.state.not_in(_NOT_RESET),
            Decision.incident_id.is_distinct_from(incident.id),
        )
    ):
        # An index without an address in the inventory names no GPU a suspect can: it cannot be counted.
        address = kernel_pci(pci) if pci is not None else addresses.get((node, gpu))
        if address is not None:
            resets[(node, address)].append(created_at)
    return indexes, dict(resets)


def _network_rows(session: Session, proposal: IncidentProposal) -> list[tuple[str, datetime, dict[str, Any] | None]]:
    """(node, observed at, evidence) of the suspects' findings of a network incident (for flap tolerance)."""
    if proposal.root_cause != "network":
        return []
    ids = [i for s in proposal.suspects for i in s.finding_ids]
    return [
        (node, at, evidence)
        for node, at, evidence in session.execute(
            select(Node.name, Finding.observed_at, Finding.evidence)
            .join(Node, Node.id == Finding.node_id)
            .where(Finding.id.in_(ids))
        )
    ]


def network_fatal(rows: Iterable[tuple[str, datetime, dict[str, Any] | None]]) -> set[str]:
    """Nodes whose network findings say the adapter itself failed (ml/signatures/network.py's `adapter_failed`)."""
    return {node for node, _, evidence in rows if (evidence or {}).get("adapter_failed")}


# An error NCCL reports of a link that just flapped (its IB retries run out some seconds after the link went down:
# NCCL_IB_TIMEOUT 18 and 7 retries are about 7.5 s) is that flap's consequence, not a second fault: from this long
# before a named flap (clocks and polls apart) to this long after it.
FLAP_CONSEQUENCE_S = (2.0, 15.0)


def network_times(rows: Iterable[tuple[str, datetime, dict[str, Any] | None]]) -> dict[str, list[datetime]]:
    """(node, observed at, evidence) of network findings -> per node, the distinct times a fault was seen. A port's
    flap named by its link_downed count (`port_flaps`: the agent's port watch within a second, the window rule
    later, ml/node_signals.py) is one fault however many findings report it, at its first report; another finding's
    time around a named flap (NCCL's IB error of it, FLAP_CONSEQUENCE_S) is that flap too."""
    other: dict[str, set[datetime]] = defaultdict(set)
    flaps: dict[tuple[str, str, int], datetime] = {}
    for node, observed_at, evidence in rows:
        ev = evidence or {}
        reported = ev.get("port_flaps") or []
        named = [f for f in reported if isinstance(f, dict) and isinstance(f.get("link_downed"), int)]
        for flap in named:
            at = _as_time(flap.get("at"))
            key = (node, str(flap.get("port")), flap["link_downed"])
            if at is not None and (key not in flaps or at < flaps[key]):
                flaps[key] = at
        if named and len(named) == len(reported):
            continue  # every flap it reports is named: counted by name, not again by its times
        other[node].add(observed_at)
        other[node].update(_times(ev.get("times", [])))
    out: dict[str, set[datetime]] = defaultdict(set)
    for (node, _, _), at in flaps.items():
        out[node].add(at)
    before, after = (timedelta(seconds=s) for s in FLAP_CONSEQUENCE_S)
    for node, times in other.items():
        named_at = set(out[node])
        out[node] |= {t for t in times if not any(f - before <= t <= f + after for f in named_at)}
    return {node: sorted(times) for node, times in out.items() if times}


def broken_flaps(rows: Iterable[tuple[str, datetime, dict[str, Any] | None]]) -> dict[str, datetime]:
    """(node, observed at, evidence) of network findings -> per node, its first flap that broke the job's connections:
    a port of the node went down (`port_flaps`) and the node's IB completions failed with a link status
    (`connections_lost`: NCCL's communicator cannot carry on) within FLAP_CONSEQUENCE_S of it. The peers' errors
    of the same moment are on other nodes, whose own links did not drop."""
    flaps: dict[str, list[datetime]] = defaultdict(list)
    errors: dict[str, list[datetime]] = defaultdict(list)
    for node, _, evidence in rows:
        ev = evidence or {}
        flaps[node] += _times(flap.get("at") for flap in ev.get("port_flaps") or [] if isinstance(flap, dict))
        if ev.get("connections_lost"):
            errors[node] += _times(ev.get("times", []))
    before, after = (timedelta(seconds=s) for s in FLAP_CONSEQUENCE_S)
    out = {}
    for node, times in flaps.items():
        broke = [f for f in times if any(f - before <= e <= f + after for e in errors.get(node, ()))]
        if broke:
            out[node] = min(broke)
    return out


def lone_broken_flaps(
    rows: Iterable[tuple[str, datetime, dict[str, Any] | None]],
    *,
    drops_since: Callable[[datetime], Mapping[str, Sequence[datetime]]],
    now: datetime,
    settings: Settings,
) -> dict[str, datetime]:
    """The suspects' flaps that broke the job's connections (`broken_flaps`), within the flap window, at least
    `policy_network_broken_flap_s` old, with no other machine's port down within that long of them: one node's link,
    not a switch or a rack whose machines all dropped at once (a shared cause, decided for its component).
    `drops_since(t)`: node -> when its ports went down, the fleet's, from t on (`port_drops`)."""
    quiet = timedelta(seconds=settings.policy_network_broken_flap_s)
    window = timedelta(seconds=settings.policy_network_flap_window_s)
    if not quiet:
        return {}
    broken = {n: at for n, at in broken_flaps(rows).items() if now - window <= at <= now - quiet}
    if not broken:
        return {}
    dropped = drops_since(min(broken.values()) - quiet)
    return {
        node: at
        for node, at in broken.items()
        if not any(abs(t - at) <= quiet for other, times in dropped.items() if other != node for t in times)
    }


def port_drops(session: Session, *, since: datetime, settings: Settings) -> dict[str, list[datetime]]:
    """Node -> when its ports went down (its network findings' `port_flaps`, or a port the window rule found down),
    over the fleet, from `since` on."""
    dropped: dict[str, list[datetime]] = defaultdict(list)
    for name, evidence in session.execute(
        select(Node.name, Finding.evidence)
        .join(Node, Node.id == Finding.node_id)
        .where(
            # created_at (the database's clock) bounds the scan by its index; the flaps' own times decide.
            Finding.created_at
            >= func.least(since, func.now()) - timedelta(seconds=settings.policy_network_flap_window_s),
            Finding.observed_at >= since,
            Finding.category == "network",
        )
    ):
        ev = evidence or {}
        stamps = [flap.get("at") for flap in ev.get("port_flaps") or [] if isinstance(flap, dict)]
        if ev.get("rule") == "down":  # a port that stayed down, from the window rule: the windows it was down in
            stamps += ev.get("times", [])
        if times := [at for at in _times(stamps) if at >= since]:
            dropped[name] += times
    return dict(dropped)


def _times(values: Iterable[object]) -> list[datetime]:
    """The values that are times (datetimes or ISO strings), as datetimes; the rest dropped."""
    return [at for value in values if (at := _as_time(value)) is not None]


def _as_time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _evidence_chain(session: Session, plans: list[DecisionPlan]) -> dict[int, dict[str, Any]]:
    """Finding id -> what a person needs to follow the decision back to the signals."""
    ids = {i for p in plans for i in p.finding_ids}
    chain: dict[int, dict[str, Any]] = {}
    for f in session.scalars(select(Finding).where(Finding.id.in_(ids))):
        chain[f.id] = {
            "id": f.id,
            "detector": f.detector,
            "category": f.category,
            "confidence": f.confidence,
            "summary": f.summary,
            "observed_at": f.observed_at.isoformat(),
            "signals": (f.evidence or {}).get("signals", [])[:_MAX_CHAIN_SIGNALS],
        }
    return chain


def _select_out():  # type: ignore[no-untyped-def]
    return (
        select(Decision, Job.external_id, Node.name)
        .outerjoin(Job, Job.id == Decision.job_id)
        .outerjoin(Node, Node.id == Decision.node_id)
    )


def get(session: Session, *, decision_id: int) -> DecisionOut:
    row = session.execute(_select_out().where(Decision.id == decision_id)).first()
    if row is None:
        raise NotFound(f"no decision {decision_id}")
    decision, job_id, node = row
    return DecisionOut.model_validate(Joined(decision, job_id=job_id, node=node))


def for_incident(session: Session, *, incident_id: int) -> list[DecisionOut]:
    rows = session.execute(_select_out().where(Decision.incident_id == incident_id).order_by(Decision.id)).all()
    return [DecisionOut.model_validate(Joined(d, job_id=j, node=n)) for d, j, n in rows]


def list_decisions(
    session: Session,
    *,
    state: str | Sequence[str] | None = None,
    kind: str | Sequence[str] | None = None,
    job: str | None = None,
    node: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
    after: int | None = None,
    partial: bool = False,
) -> DecisionPage:
    """Newest first, filtered, keyset-paginated on id; `after` keeps only decisions newer than that id. `job` and
    `node` are exact names, as a scheduler acting on what it lists needs them; `partial` matches a part of the name
    instead, as the web UI's list filters do."""
    query = _select_out().order_by(Decision.id.desc())
    if after is not None:
        query = query.where(Decision.id > after)
    if state:
        query = query.where(Decision.state.in_([state] if isinstance(state, str) else state))
    if kind:
        query = query.where(Decision.kind.in_([kind] if isinstance(kind, str) else kind))
    if job:
        query = query.where(Job.external_id.icontains(job, autoescape=True) if partial else Job.external_id == job)
    if node:
        query = query.where(Node.name.icontains(node, autoescape=True) if partial else Node.name == node)
    if cursor:
        query = query.where(Decision.id < decode_cursor(cursor))
    rows = session.execute(query.limit(limit + 1)).all()
    items = [DecisionOut.model_validate(Joined(d, job_id=j, node=n)) for d, j, n in rows[:limit]]
    return DecisionPage(items=items, next_cursor=encode_cursor(rows[limit - 1][0].id) if len(rows) > limit else None)
