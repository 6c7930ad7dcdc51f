"""Backtest a policy: replay stored incidents' findings through a candidate policy and say what it would change.

The replay runs the real demarcation (ml.demarcation) and the real policy (decisions.policy: build_context and
decide) over each incident's stored findings, one step per moment findings were stored (a diagnosis pass), in
that order, all incidents on one timeline so cooldowns and blast radius see the candidate's own earlier
decisions. It runs twice, with the current policy and with the candidate: the current replay explains a
difference guard rail by guard rail. The escalation ladder climbs on the replay's own remedies (and those stored
outside the replayed incidents) against the nodes' stored faults, so a candidate's ladder thresholds replay too.
Not replayed: maintenance windows (silences), the job's membership at the time (today's node count is the blast
radius denominator), the GPU reset limit's count of earlier resets, and passes that stored no new finding.

It never writes: callers run it inside `read_only`, which Postgres enforces.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import or_, select, text
from sqlalchemy.orm import Session

from ml import demarcation
from ml.ladder import History, Remedy
from service.config import Settings
from service.decisions import overrides
from service.decisions.policy import INACTIVE, PriorDecision, Skipped, build_context, decide, prior_window
from service.decisions.service import lone_broken_flaps, network_fatal, network_times, port_drops
from service.jobs import service as jobs
from service.models import Decision, Finding, Incident, Job, Node
from service.nodes import ladder as node_ladder

# As the live path: findings older than this at a pass no longer join the incident (diagnosis.FINDING_HORIZON).
FINDING_HORIZON = timedelta(hours=1)


@contextmanager
def read_only(session: Session) -> Iterator[Session]:
    """A savepoint in a READ ONLY transaction, rolled back after: Postgres refuses any write made inside."""
    savepoint = session.begin_nested()
    try:
        session.execute(text("SET TRANSACTION READ ONLY"))
        yield session
    finally:
        savepoint.rollback()


@dataclass(frozen=True, slots=True)
class Verdict:
    """One decision: stored, or the one a replay would make."""

    kind: str
    node: str | None
    state: str
    at: datetime
    approval: bool  # waits (or waited) for a person
    rails: dict[str, str]

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.node or "")

    @property
    def effect(self) -> str:
        return "shadow" if self.state == "shadow" else "approval" if self.approval else "act"

    def describe(self) -> str:
        what = f"{self.kind} {self.node}" if self.node else self.kind
        return f"{what} ({'needs approval' if self.approval and self.state != 'shadow' else self.state})"


@dataclass(slots=True)
class _Replayed:
    verdicts: list[Verdict] = field(default_factory=list)
    # Per node (None: the job), the last reason the policy gave for deciding nothing new about it.
    skipped: dict[str | None, Skipped] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Difference:
    kind: str
    node: str | None
    change: str  # added, removed, or "act -> approval" and the like
    why: str


@dataclass(slots=True)
class IncidentResult:
    incident_id: int
    job: str
    root_cause: str
    opened_at: datetime
    steps: int
    decided: list[Verdict]
    candidate: list[Verdict]
    differences: list[Difference]

    def time_to_decision(self, verdicts: Sequence[Verdict]) -> float | None:
        return min((v.at - self.opened_at).total_seconds() for v in verdicts) if verdicts else None


@dataclass(slots=True)
class Totals:
    incidents: int
    changed_incidents: int
    evictions: tuple[int, int]  # decided, candidate
    evictions_added: int
    evictions_removed: int
    approvals: tuple[int, int]
    diagnoses: tuple[int, int]
    job_actions: tuple[int, int]  # restarts and rollbacks
    ttd_median_s: tuple[float | None, float | None]
    ttd_p95_s: tuple[float | None, float | None]


@dataclass(slots=True)
class Backtest:
    since: datetime
    until: datetime
    jobs: list[str]
    changed_settings: dict[str, tuple[Any, Any]]
    incidents: list[IncidentResult]
    totals: Totals


@dataclass(slots=True)
class _Stored:
    """One incident as stored: its findings in the order they were stored, its job."""

    incident: Incident
    job: Job
    findings: list[tuple[Finding, str | None]]


def run(
    session: Session,
    *,
    settings: Settings,
    candidate: Settings,
    since: datetime,
    until: datetime,
    job_ids: Sequence[str] = (),
) -> Backtest:
    """Replay the incidents opened in [since, until) (of these jobs, or all) through `candidate`; reads only."""
    stored = _incidents(session, since=since, until=until, job_ids=job_ids)
    ids = [s.incident.id for s in stored]
    decided: dict[int, list[Verdict]] = defaultdict(list)
    for decision, node in session.execute(
        select(Decision, Node.name)
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(Decision.incident_id.in_(ids or [0]), Decision.created_at <= until)
        .order_by(Decision.created_at, Decision.id)
    ):
        decided[decision.incident_id or 0].append(_stored_verdict(decision, node))
    reach = max(prior_window(settings), prior_window(candidate))
    background = _background(session, ids=ids, since=since - reach, until=until)
    job_nodes = {s.job.id: len(jobs.node_ids(session, job=s.job)) for s in stored}
    ladders = _ladder_background(session, stored, settings=settings, candidate=candidate, since=since, until=until)
    # The fleet's port drops over the range, for the lone-flap rule (one read for both runs).
    drops = port_drops(session, since=since - reach, settings=candidate)
    current_run = _replay(stored, background, job_nodes, settings, drops, ladders)
    candidate_run = _replay(stored, background, job_nodes, candidate, drops, ladders)

    results = []
    for s in stored:
        iid = s.incident.id
        results.append(
            IncidentResult(
                incident_id=iid,
                job=s.job.external_id,
                root_cause=s.incident.root_cause,
                opened_at=s.incident.opened_at,
                steps=len({f.created_at for f, _ in s.findings}),
                decided=decided[iid],
                candidate=candidate_run[iid].verdicts,
                differences=_differences(decided[iid], current_run[iid], candidate_run[iid]),
            )
        )
    return Backtest(
        since=since,
        until=until,
        jobs=sorted(job_ids),
        changed_settings=overrides.changed(settings, candidate),
        incidents=results,
        totals=_totals(results),
    )


def _incidents(session: Session, *, since: datetime, until: datetime, job_ids: Sequence[str]) -> list[_Stored]:
    query = (
        select(Incident, Job)
        .join(Job, Job.id == Incident.job_id)
        .where(Incident.opened_at >= since, Incident.opened_at < until)
        .order_by(Incident.opened_at, Incident.id)
    )
    if job_ids:
        query = query.where(Job.external_id.in_(job_ids))
    found = [_Stored(incident, job, []) for incident, job in session.execute(query)]
    by_id = {s.incident.id: s for s in found}
    for finding, node in session.execute(
        select(Finding, Node.name)
        .outerjoin(Node, Node.id == Finding.node_id)
        .where(Finding.incident_id.in_(list(by_id) or [0]), Finding.created_at <= until)
        .order_by(Finding.created_at, Finding.id)
    ):
        by_id[finding.incident_id or 0].findings.append((finding, node))
    return found


def _background(session: Session, *, ids: Sequence[int], since: datetime, until: datetime) -> list[PriorDecision]:
    """Stored decisions outside the replayed incidents that the guard rails count (evictions, job actions)."""
    rows = session.execute(
        select(Decision.kind, Node.name, Decision.state, Decision.created_at, Decision.job_id, Decision.incident_id)
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(
            Decision.created_at >= since,
            Decision.created_at <= until,
            Decision.state.not_in(INACTIVE),
            or_(Decision.incident_id.is_(None), Decision.incident_id.not_in(list(ids) or [0])),
            or_(Decision.kind == "evict", Decision.node_id.is_(None)),
        )
        .order_by(Decision.created_at, Decision.id)
    )
    return [PriorDecision(*row) for row in rows]


def _ladder_background(
    session: Session,
    stored: Sequence[_Stored],
    *,
    settings: Settings,
    candidate: Settings,
    since: datetime,
    until: datetime,
) -> dict[str, History]:
    """The escalation ladder's history of the replayed incidents' nodes: their faults, and the remedies decided
    outside the replayed incidents (the replay makes its own)."""
    names = {node for s in stored for _, node in s.findings if node}
    reach = max(node_ladder.thresholds(settings).lookback_s, node_ladder.thresholds(candidate).lookback_s)
    found = node_ladder.histories(
        session, names=names, now=until, settings=settings, since=since - timedelta(seconds=reach), afresh=False
    )
    cuts = node_ladder.rma_cuts(session, names=names)
    replayed = set(
        session.scalars(select(Decision.id).where(Decision.incident_id.in_([s.incident.id for s in stored] or [0])))
    )
    return {
        name: History([r for r in h.remedies if r.decision_id not in replayed], h.faults, cuts.get(name))
        for name, h in found.items()
    }


def _ladders(
    nodes: Sequence[str], found: Mapping[str, History], made: Sequence[tuple[str, Remedy]], at: datetime
) -> dict[str, History]:
    """The ladder's history of these nodes as it stood at `at`: stored, and what the replay decided so far; after
    a node's vendor replacement (its RMA mark), only what came after it."""
    out = {}
    for node in nodes:
        h = found.get(node, History())
        start = h.since if h.since is not None and h.since <= at else None
        mine = [r for n, r in made if n == node]
        remedies = sorted([*(r for r in h.remedies if r.at <= at), *mine], key=lambda r: r.at)
        faults = [f for f in h.faults if f.at <= at]
        if start is not None:
            remedies, faults = [r for r in remedies if r.at >= start], [f for f in faults if f.at >= start]
        out[node] = History(remedies, faults)
    return out


def _stored_verdict(decision: Decision, node: str | None) -> Verdict:
    rails = {str(k): str(v) for k, v in ((decision.evidence or {}).get("guard_rails") or {}).items()}
    # Its state moves on once a person approves it; its guard rails still say it had to wait for one.
    approval = (
        decision.state == "awaiting_approval"
        or rails.get("mode") == "approval required"
        or rails.get("blast_radius", "").startswith("over the limit")
    )
    return Verdict(decision.kind, node, decision.state, decision.created_at, approval, rails)


def _of_incident(proposals: Sequence[demarcation.IncidentProposal], incident: Incident) -> demarcation.IncidentProposal:
    """The replayed proposal of a stored incident: its root cause and machine (its findings may also split off
    another, which was its own incident). One stored before incidents were per machine held every machine's fault
    of its root cause: their proposals, merged."""
    own = [p for p in proposals if p.root_cause == incident.root_cause and incident.anchor in ("", p.anchor)]
    if len(own) <= 1:
        return own[0] if own else proposals[0]
    suspects = sorted((x for p in own for x in p.suspects), key=lambda x: (-x.confidence, x.node))
    return replace(own[0], suspects=suspects, finding_ids=[i for p in own for i in p.finding_ids])


def _replay(
    stored: Sequence[_Stored],
    background: Sequence[PriorDecision],
    job_nodes: dict[int, int],
    policy: Settings,
    drops: Mapping[str, Sequence[datetime]],
    ladders: Mapping[str, History] | None = None,
) -> dict[int, _Replayed]:
    """Every incident's steps on one timeline (by time, then incident), through the real demarcation and policy."""
    by_id = {s.incident.id: s for s in stored}
    steps = sorted({(f.created_at, s.incident.id) for s in stored for f, _ in s.findings})
    out = {s.incident.id: _Replayed() for s in stored}
    made: list[PriorDecision] = []
    remedies: list[tuple[str, Remedy]] = []  # the replay's own, for the escalation ladder
    for at, iid in steps:
        s = by_id[iid]
        rows = [(f, node) for f, node in s.findings if at - FINDING_HORIZON <= f.created_at <= at]
        proposals = demarcation.demarcate([(f.id, f.to_ml(node)) for f, node in rows])
        if not proposals:
            continue
        proposal = _of_incident(proposals, s.incident)
        suspect_ids = {i for suspect in proposal.suspects for i in suspect.finding_ids}
        network_rows = (
            [(node, f.observed_at, f.evidence) for f, node in rows if f.id in suspect_ids and node]
            if proposal.root_cause == "network"
            else []
        )
        replayed = out[iid]
        ctx = build_context(
            now=at,
            job_id=s.job.id,
            incident_id=iid,
            job_nodes=job_nodes[s.job.id],
            prior=[d for d in background if d.created_at <= at] + made,
            network_events=network_times(network_rows),
            network_fatal=network_fatal(network_rows),
            network_broken=lone_broken_flaps(network_rows, drops_since=lambda _: drops, now=at, settings=policy),
            already_decided={(v.kind, v.node) for v in replayed.verdicts},
            settings=policy,
            ladders=_ladders([x.node for x in proposal.suspects], ladders or {}, remedies, at),
        )
        skipped: list[Skipped] = []
        for plan in decide(proposal, ctx, policy, skipped):
            approval = plan.state == "awaiting_approval"
            replayed.verdicts.append(Verdict(plan.kind, plan.node, plan.state, at, approval, dict(plan.guard_rails)))
            made.append(PriorDecision(plan.kind, plan.node, plan.state, at, s.job.id, iid))
            rung = node_ladder.rung_of(plan.kind, {"ladder": plan.ladder})
            if plan.node and rung:
                remedies.append((plan.node, Remedy(rung, at, proposal.root_cause, None, plan.state)))
        for note in skipped:
            if note.rail != "already_decided":
                replayed.skipped[note.node] = note
    return out


def _rails(rails: dict[str, str]) -> str:
    return "; ".join(f"{name}: {value}" for name, value in sorted(rails.items()))


def _side(replayed: _Replayed, node: str | None) -> str:
    """What a policy did about a node (or the job), with its guard rails, or why it did nothing."""
    made = [v for v in replayed.verdicts if v.node == node]
    if made:
        return ", ".join(f"{v.describe()} [{_rails(v.rails)}]" for v in made)
    note = replayed.skipped.get(node)
    return f"nothing [{note.rail}: {note.why}]" if note else "nothing [no finding asked for it]"


def _differences(decided: Sequence[Verdict], current: _Replayed, candidate: _Replayed) -> list[Difference]:
    was = {v.key: v for v in decided}
    would = {v.key: v for v in candidate.verdicts}
    replayed_now = {v.key: v for v in current.verdicts}
    out = []
    for key in sorted(was.keys() | would.keys()):
        before, after = was.get(key), would.get(key)
        if before is None:
            change = "added"
        elif after is None:
            change = "removed"
        elif before.effect != after.effect:
            change = f"{before.effect} -> {after.effect}"
        else:
            continue
        node = key[1] or None
        why = f"current policy: {_side(current, node)}; candidate: {_side(candidate, node)}"
        replayed = replayed_now.get(key)
        if (replayed.effect if replayed else None) != (before.effect if before else None):
            why += (
                "; note: the current policy's replay does not reproduce the stored decision "
                "(settings changed since, a silence, or a person's action)"
            )
        out.append(Difference(kind=key[0], node=node, change=change, why=why))
    return out


def _percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _totals(results: Sequence[IncidentResult]) -> Totals:
    def count(test: Any) -> tuple[int, int]:
        return (
            sum(1 for r in results for v in r.decided if test(v)),
            sum(1 for r in results for v in r.candidate if test(v)),
        )

    evicted_before = {(r.incident_id, v.node) for r in results for v in r.decided if v.kind == "evict"}
    evicted_after = {(r.incident_id, v.node) for r in results for v in r.candidate if v.kind == "evict"}
    ttd_before = [t for r in results if (t := r.time_to_decision(r.decided)) is not None]
    ttd_after = [t for r in results if (t := r.time_to_decision(r.candidate)) is not None]
    return Totals(
        incidents=len(results),
        changed_incidents=sum(1 for r in results if r.differences),
        evictions=count(lambda v: v.kind == "evict"),
        evictions_added=len(evicted_after - evicted_before),
        evictions_removed=len(evicted_before - evicted_after),
        approvals=count(lambda v: v.approval and v.state != "shadow"),
        diagnoses=count(lambda v: v.kind == "diagnose"),
        job_actions=count(lambda v: v.kind in ("restart", "rollback")),
        ttd_median_s=(_percentile(ttd_before, 50), _percentile(ttd_after, 50)),
        ttd_p95_s=(_percentile(ttd_before, 95), _percentile(ttd_after, 95)),
    )
