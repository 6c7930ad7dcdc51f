"""A preflight's outcome stored as check results, and the bad nodes it named decided on before the job starts.

Every node gets its own results (GEMM, local all-reduce: judged again against the fleet, as the stop-time checks'
are) and one summary result: `preflight_local` failed (its own checks), `preflight_network` failed (slow with every
node, or the link to its pair), or `preflight_network` passed. A failing verdict is a finding (service/checks),
here tied to the job; then the job's decide step runs at once (diagnosis.service.diagnose_events, what a fatal Xid
triggers): demarcation opens an incident per machine and the policy decides with its usual guard rails (blast
radius, cooldowns, flap tolerance, silences, shadow and approval modes). A slow node failed several rounds, each a
time in its finding's evidence, which is what flap tolerance counts; a pair is named on both ends, neither proven
at fault, so its findings ask for a diagnosis, not an eviction.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.checks import service as checks
from service.checks.schemas import CheckResultIn
from service.config import Settings
from service.diagnosis import service as diagnosis
from service.jobs import service as jobs
from service.jobs.schemas import JobIn, RankPlacement
from service.models import Decision, Finding, Job, Node
from service.nodes.service import ensure_nodes
from service.preflight.schemas import (
    CriteriaOut,
    CriterionOut,
    DecisionBrief,
    GroupIn,
    PreflightIn,
    PreflightOut,
    RoundIn,
)

CRITERIA_CHECKS = ("gemm_bf16", "allreduce_node", "allreduce_peer")
MAX_GROUPS_KEPT = 30  # per node, the groups it was measured in (its evidence); the rest are counted


def criteria(session: Session, *, model: str, now: datetime | None = None) -> CriteriaOut:
    """The fleet's cut-offs for the preflight's figures on this GPU model."""
    now = now or datetime.now(UTC)
    out = {}
    for check in CRITERIA_CHECKS:
        rule = checks.fleet_criterion(session, check=check, model=model, now=now)
        out[check] = CriterionOut(cutoff=rule.cutoff, basis=rule.basis, history=rule.history, median=rule.median)
    return CriteriaOut(model=model, checks=out)


def _job(session: Session, *, preflight: PreflightIn, now: datetime) -> Job:
    """The job, registered with one rank per node if its scheduler has not registered it yet (a Slurm
    PrologSlurmctld has, before the nodes' prologs run): the policy's blast radius counts its nodes."""
    job = session.scalar(select(Job).where(Job.external_id == preflight.job_id))
    if job is not None:
        return job
    ranks = [RankPlacement(rank=i, node=node, local_rank=0) for i, node in enumerate(preflight.nodes)]
    return jobs.register(
        session, job_in=JobIn(job_id=preflight.job_id, world_size=len(preflight.nodes), ranks=ranks), now=now
    )


Membership = dict[str, list[tuple[RoundIn, GroupIn]]]


def _membership(preflight: PreflightIn) -> Membership:
    """Node -> the cross-node groups it was measured in, once for the whole allocation."""
    out: Membership = {}
    for r in preflight.rounds:
        if r.phase == "local":
            continue
        for g in r.groups:
            for node in g.nodes:
                out.setdefault(node, []).append((r, g))
    return out


def _groups_of(node: str, membership: Membership) -> tuple[list[dict[str, Any]], list[str], float | None]:
    """(the groups the node was measured in, when its failing ones ended, its best passing bandwidth)."""
    groups: list[dict[str, Any]] = []
    failed_at: list[str] = []
    best: float | None = None
    for r, g in membership.get(node, []):
        groups.append(
            {
                "round": r.index,
                "phase": r.phase,
                "size": len(g.nodes),
                "verdict": g.verdict,
                "why": g.why,
                "figures": g.figures,
                "ref": g.ref,
            }
        )
        if g.verdict == "fail" and r.at and g.ref != node:
            failed_at.append(r.at)
        bw = g.figures.get("busbw_gbps")
        if g.verdict == "pass" and bw is not None:
            best = bw if best is None else max(best, bw)
    return groups, failed_at, best


def _summary(
    preflight: PreflightIn, node: str, membership: Membership, *, preflight_id: str, now: datetime
) -> CheckResultIn:
    named = {n.node: n for n in preflight.named}
    unresolved = {n.node: n for n in preflight.unresolved}
    groups, failed_at, best = _groups_of(node, membership)
    evidence: dict[str, Any] = {"preflight": preflight_id, "groups": groups[:MAX_GROUPS_KEPT]}
    if len(groups) > MAX_GROUPS_KEPT:
        evidence["groups_not_kept"] = len(groups) - MAX_GROUPS_KEPT
    base = {"ts": now, "directive_id": f"preflight:{preflight_id}", "subject": "node"}
    if node in named:
        n = named[node]
        evidence.update(shape=n.shape, problems=[n.why], rounds=n.rounds, times=sorted(set(failed_at)))
        if n.peer:
            evidence["peer"] = n.peer
        check = "preflight_local" if n.shape == "local" else "preflight_network"
        return CheckResultIn(**base, check=check, status="fail", evidence=evidence)
    if node in unresolved:
        evidence.update(reason=unresolved[node].why, shape="unresolved")
        return CheckResultIn(**base, check="preflight_network", status="not_available", evidence=evidence)
    if not groups:
        evidence["reason"] = "not measured with other nodes (the search ended first, or the allocation is one node)"
        return CheckResultIn(**base, check="preflight_network", status="not_available", evidence=evidence)
    return CheckResultIn(
        **base,
        check="preflight_network",
        status="pass",
        measured=best,
        unit="GB/s" if best else None,
        evidence=evidence,
    )


def record(
    session: Session, *, preflight: PreflightIn, settings: Settings, now: datetime | None = None
) -> PreflightOut:
    """Store a preflight's results and decide on the nodes it named (flushes; the request commits)."""
    now = now or datetime.now(UTC)
    preflight_id = str(uuid.uuid4())
    job = _job(session, preflight=preflight, now=now)
    node_ids = ensure_nodes(session, names=set(preflight.nodes))
    pairs = {n.node for n in preflight.named if n.shape == "pair"}
    membership = _membership(preflight)
    stored = 0
    for node in preflight.nodes:
        items = [
            CheckResultIn(ts=now, directive_id=f"preflight:{preflight_id}", **r.model_dump())
            for r in preflight.results.get(node, [])
        ]
        items.append(_summary(preflight, node, membership, preflight_id=preflight_id, now=now))
        rows = checks.record(session, node_id=node_ids[node], node=node, batch_id=uuid.uuid4(), items=items, now=now)
        stored += len(rows)
        finding_ids = [row.finding_id for row in rows if row.finding_id is not None]
        for finding in session.scalars(select(Finding).where(Finding.id.in_(finding_ids))):
            finding.job_id = job.id  # the job's own evidence: its decide step reads it
            if node in pairs and finding.evidence.get("check") == "preflight_network":
                finding.action = "diagnose"  # either end (or the cable, the switch port between them)
            times = finding.evidence.get("details", {}).get("times")
            if times:
                finding.evidence = {**finding.evidence, "times": times}  # repeated observations: flap tolerance
    session.flush()
    result = diagnosis.diagnose_events(session, job_id=preflight.job_id, settings=settings, now=now)
    decisions = session.execute(
        select(Decision, Node.name)
        .outerjoin(Node, Node.id == Decision.node_id)
        .where(Decision.id.in_(result.decisions))
    ).all()
    return PreflightOut(
        id=preflight_id,
        job_id=preflight.job_id,
        named=sorted({n.node for n in preflight.named}),
        check_results=stored,
        incidents=result.incidents,
        decisions=[
            DecisionBrief(id=d.id, node=name, kind=d.kind, state=d.state, reason=d.reason or "")
            for d, name in sorted(decisions, key=lambda row: row[0].id)
        ],
    )
