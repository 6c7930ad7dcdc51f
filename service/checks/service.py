"""Store the stop-time check results of a batch, with the service's verdict, and a finding for each failure.

The agent judged each result on its own (spec of the driver state, its node's median for a figure). A figure
that passed there is judged again here against the fleet (ml/check_criteria.py): the same check on the same GPU
model across the last HISTORY_DAYS of passing results. This runs in the ingest request, against the rule that
ingest does no analysis, because it is one indexed query per (check, GPU model) and only for the rare batch that
carries a suite's results (one per suite), so the verdict is stored with the row that a person reads next.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml.check_criteria import Criterion, criterion, judge, spec_of
from service.checks.schemas import CheckResultIn
from service.models import CheckResult, Directive, Finding, Gpu, Node

HISTORY_DAYS = 30
HISTORY_MAX = 5000  # the most recent passing figures read per (check, GPU model)
# Figures where higher is better and the fleet's distribution decides.
FLEET_JUDGED = frozenset({"gemm_bf16", "memory_bandwidth", "h2d_bandwidth", "allreduce_node", "allreduce_peer"})
# The finding category of a failing check (ml/findings.py CATEGORIES); dcgm:* and the rest are the GPU's.
CATEGORY = {
    "allreduce_node": "nvlink",
    "allreduce_peer": "network",
    "ib_port": "network",
    "memory_available": "host",
    "pressure": "host",
    "disk_free": "storage",
    "preflight_network": "network",  # service/preflight: slow with every node, or a bad link to one
}
DETECTOR = "stop_checks"
FAILED_CHECK_CONFIDENCE = 0.9  # a measured failure on a drained node: strong, but one run


def _history(session: Session, *, check: str, model: str | None, now: datetime) -> list[float]:
    model_match = CheckResult.gpu_model.is_(None) if model is None else CheckResult.gpu_model == model
    rows = session.scalars(
        select(CheckResult.measured)
        .where(
            CheckResult.check == check,
            model_match,
            CheckResult.verdict == "pass",
            CheckResult.measured.is_not(None),
            CheckResult.ts > now - timedelta(days=HISTORY_DAYS),
        )
        .order_by(CheckResult.ts.desc())
        .limit(HISTORY_MAX)
    )
    return [float(v) for v in rows if v is not None]


def fleet_criterion(session: Session, *, check: str, model: str, now: datetime) -> Criterion:
    """The cut-off a figure of this check on this GPU model is judged by now (what `record` applies)."""
    return criterion(_history(session, check=check, model=model, now=now), spec=spec_of(model, check))


def _verdict(
    session: Session,
    item: CheckResultIn,
    model: str | None,
    now: datetime,
    cache: dict[tuple[str, str | None], list[float]],
) -> tuple[str, str, float | None, dict[str, Any]]:
    """(verdict, basis, cutoff, what the service adds to the evidence)."""
    status = item.status or "refused"
    if status != "pass" or item.check not in FLEET_JUDGED or item.measured is None:
        return status, "agent", None, {}
    key = (item.check, model)
    if key not in cache:  # the fleet before this batch: GPUs of one node do not judge each other twice
        cache[key] = _history(session, check=item.check, model=model, now=now)
    result = judge(item.measured, cache[key], spec=spec_of(model, item.check))
    rule = result.criterion
    if result.status == "not_judged":
        return "pass", "agent", None, {"fleet": {"history": rule.history, "basis": "none"}}
    added = {"fleet": {"history": rule.history, "basis": rule.basis, "cutoff": rule.cutoff, "median": rule.median}}
    if result.shortfall is not None:
        added["fleet"]["shortfall"] = result.shortfall
    return result.status, rule.basis, rule.cutoff, added


def _gpu(subject: str) -> int | None:
    kind, _, rest = subject.partition(":")
    return int(rest) if kind == "gpu" and rest.isdigit() else None


def _summary(row: CheckResult, node: str) -> str:
    where = f"{node} GPU {_gpu(row.subject)}" if _gpu(row.subject) is not None else f"{node} {row.subject}"
    if row.measured is not None and row.cutoff is not None:
        return f"check {row.check} failed on {where}: {row.measured:g} {row.unit or ''} below {row.cutoff:g}".rstrip()
    problems = row.evidence.get("problems") or row.evidence.get("warnings") or row.evidence.get("errors")
    detail = f": {problems[0]}" if isinstance(problems, list) and problems else ""
    return f"check {row.check} failed on {where}{detail}"[:500]


def _finding(row: CheckResult, *, node_id: int, node: str) -> Finding:
    gpu = _gpu(row.subject)
    category = CATEGORY.get(row.check, "gpu_hardware")
    return Finding(
        dedup_key=f"{DETECTOR}:{row.batch_id}:{row.check}:{row.subject}",
        node_id=node_id,
        detector=DETECTOR,
        category=category,
        subject_kind="gpu" if gpu is not None else "node",
        subject=f"{node}/{gpu}" if gpu is not None else node,
        confidence=FAILED_CHECK_CONFIDENCE,
        summary=_summary(row, node),
        blame="infrastructure",
        role="cause",
        action="evict",
        evidence={
            "check_result_id": row.id,
            "check": row.check,
            "directive_id": row.directive_id,
            "measured": row.measured,
            "cutoff": row.cutoff,
            "basis": row.basis,
            "details": row.evidence,
        },
        observed_at=row.ts,
    )


def record(
    session: Session,
    *,
    node_id: int,
    node: str,
    batch_id: uuid.UUID,
    items: list[CheckResultIn],
    now: datetime | None = None,
) -> list[CheckResult]:
    """Store one batch's check results with their verdicts; a failing verdict also becomes a finding.

    `now` bounds the fleet history read (a caller that keeps its own clock passes its time)."""
    now = now or datetime.now(UTC)
    # A figure without its model in the evidence (an all-reduce) takes the model of the node's GPUs.
    gpus = session.execute(select(Gpu.index, Gpu.model).where(Gpu.node_id == node_id, Gpu.model.is_not(None)))
    models: dict[int, str] = {index: model for index, model in gpus}
    node_model = next(iter(set(models.values()))) if len(set(models.values())) == 1 else None
    cache: dict[tuple[str, str | None], list[float]] = {}
    rows = []
    for item in items:
        gpu = _gpu(item.subject)
        model = item.evidence.get("model") if isinstance(item.evidence.get("model"), str) else None
        model = model or (models.get(gpu) if gpu is not None else node_model)
        verdict, basis, cutoff, added = _verdict(session, item, model, now, cache)
        evidence = dict(item.evidence)
        if item.refused:
            evidence["reason"] = item.refused
        evidence.update(added)
        rows.append(
            CheckResult(
                node_id=node_id,
                batch_id=batch_id,
                directive_id=item.directive_id,
                ts=item.ts,
                check=item.check or "suite",
                subject=item.subject,
                gpu_model=model,
                status=item.status or "refused",
                verdict=verdict,
                basis=basis,
                measured=item.measured,
                expected=item.expected,
                cutoff=cutoff,
                unit=item.unit,
                duration_s=item.duration_s,
                evidence=evidence,
            )
        )
    session.add_all(rows)
    session.flush()
    failed = [(row, _finding(row, node_id=node_id, node=node)) for row in rows if row.verdict == "fail"]
    if failed:
        session.add_all([finding for _, finding in failed])
        session.flush()
        for row, finding in failed:
            row.finding_id = finding.id
        session.flush()
    return rows


# -- asking for checks -----------------------------------------------------------------------------

# The cross-node all-reduce's rendezvous port on the peer (the rank-0 side), away from torchrun's default 29500.
PEER_PORTS = range(29600, 30000)


def request_checks(
    session: Session,
    *,
    node: Node,
    level: int,
    force: bool,
    peer: Node | None,
    requested_by: str,
    reason: str | None,
    ttl_s: int,
    decision_id: int | None = None,
    return_on_pass: bool = False,
) -> list[Directive]:
    """A run_checks directive for the node's agent; with a peer (level 3), one for the peer's agent too.

    The peer, a known-good node, is rank 0 of the cross-node all-reduce and its address is its name (nodes are
    named by hostname); it runs that check alone. Both agents run it first, so they meet within a ship interval.
    """
    expires_at = datetime.now(UTC) + timedelta(seconds=ttl_s)
    directive = Directive(
        node_id=node.id,
        kind="run_checks",
        reason=reason,
        requested_by=requested_by,
        expires_at=expires_at,
        params={"level": level, "force": force},
    )
    if decision_id is not None:  # the diagnose decision the results answer (service/checks/loop.py)
        directive.params = {**(directive.params or {}), "decision_id": decision_id}
    if return_on_pass:  # the repair gate: a clean pass returns the node (service/checks/loop.py)
        directive.params = {**(directive.params or {}), "return_on_pass": True}
    directives = [directive]
    if peer is not None:
        directive.id = uuid.uuid4()
        port = PEER_PORTS[directive.id.int % len(PEER_PORTS)]
        directive.params = {**(directive.params or {}), "peer": {"addr": peer.name, "port": port, "node_rank": 1}}
        directives.append(
            Directive(
                node_id=peer.id,
                kind="run_checks",
                reason=f"peer of {node.name}'s checks",
                requested_by=requested_by,
                expires_at=expires_at,
                params={
                    "level": 3,
                    "force": force,
                    "only": ["allreduce_peer"],
                    "peer": {"addr": peer.name, "port": port, "node_rank": 0},
                },
            )
        )
    session.add_all(directives)
    session.flush()
    return directives


def active_by_node(session: Session) -> dict[str, list[dict[str, Any]]]:
    """Unexpired node directives as ingest answers carry them, keyed by the node's name."""
    rows = session.execute(
        select(Directive.id, Directive.kind, Directive.params, Node.name)
        .join(Node, Node.id == Directive.node_id)
        .where(Directive.expires_at > datetime.now(UTC))
        .order_by(Directive.created_at)
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for directive_id, kind, params, node in rows:
        out.setdefault(node, []).append({**(params or {}), "id": str(directive_id), "kind": kind})
    return out


def results_of(session: Session, *, node: Node, directive_id: str | None, limit: int) -> list[CheckResult]:
    """The node's most recent check results (of one directive, if given), newest first."""
    query = select(CheckResult).where(CheckResult.node_id == node.id)
    if directive_id is not None:
        query = query.where(CheckResult.directive_id == directive_id)
    return list(session.scalars(query.order_by(CheckResult.ts.desc(), CheckResult.id).limit(limit)))
