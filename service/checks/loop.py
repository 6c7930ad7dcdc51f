"""The `diagnose` loop closed: a diagnose decision carried out (the node drained) sends the node's agent the
stop-time checks; their results turn into a remedy (evict, or reset the one GPU a check names where the driver
state calls for a reset) or, on a clean pass, return the node to service and resolve the incident.

The same checks are a node's return gate: every way into `returning` (a scheduler reporting the node back, work
placed on it before its gate, a person's return without diagnostics: service/nodes/lifecycle.py) sends them with
`return_on_pass`, through the `on_gate` hook registered here. A clean pass makes the node healthy; a failure takes it
out again (service/nodes/returns.py). Checks a person asks for with `return_on_pass` on a node still out of service
return it on a clean pass and on a failure leave it out with the findings.

A clean pass is no failing verdict, no refusal and at least one passing check: a node whose agent lacks PyTorch
or DCGM returns on what it could check (the results it shipped list what was not available). A suite that was
refused or only not available leaves the node to a person, as before.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from ml.peer_spans import starved
from ml.peers import DETECTOR as PEERS
from service.breaker import service as breaker
from service.bundles import service as bundles
from service.checks.schemas import CheckResultIn
from service.checks.service import record, request_checks
from service.config import Settings
from service.decisions import lifecycle as decision_lifecycle
from service.errors import Conflict
from service.incidents import service as incidents
from service.models import CheckResult, Decision, Directive, Finding, Incident, Node
from service.nodes import lifecycle as node_lifecycle
from service.nodes import returns
from service.nodes import service as nodes

log = logging.getLogger(__name__)

ACTOR = "faultline checks"
DIAGNOSE_LEVEL = 2  # minutes on an 8-GPU node: enough to separate a slow or corrupt GPU from a healthy one
DIRECTIVE_TTL_S = 900  # a drained node's agent reports every few seconds; longer means it is gone
REMEDY_CONFIDENCE = 0.9


@decision_lifecycle.after_finish
def _checks_after_diagnose(session: Session, decision: Decision, now: datetime) -> None:
    """A diagnose decision the scheduler carried out: the drained node's agent runs the checks."""
    if decision.kind != "diagnose" or decision.state != "done" or decision.node_id is None:
        return
    node = session.get(Node, decision.node_id)
    if node is None:
        return
    request_checks(
        session,
        node=node,
        level=DIAGNOSE_LEVEL,
        force=False,
        peer=None,
        requested_by=ACTOR,
        reason=f"diagnose decision {decision.id}: {decision.reason}"[:1000],
        ttl_s=DIRECTIVE_TTL_S,
        decision_id=decision.id,
    )


@node_lifecycle.on_gate
def _send_gate(session: Session, node: Node, gate: node_lifecycle.Gate, now: datetime) -> None:
    """A node entered `returning`: its agent runs the stop-time checks, whose clean pass returns it."""
    [directive] = request_checks(
        session,
        node=node,
        level=gate.level,
        force=gate.force,
        peer=None,
        requested_by=ACTOR,
        reason=f"return gate: {gate.reason}"[:1000],
        ttl_s=DIRECTIVE_TTL_S,
        return_on_pass=True,
    )
    # Whether the scheduler still holds the node out: then a pass must also tell it to take the node back.
    directive.params = {**(directive.params or {}), "undrain": gate.undrain}
    session.flush()


def accept(
    session: Session,
    *,
    node_id: int,
    node: str,
    batch_id: uuid.UUID,
    items: list[CheckResultIn],
    now: datetime,
    settings: Settings,
) -> dict[str, str]:
    """One batch's check results stored and judged, then acted on where a decision waits on them (the ingest path;
    a caller that keeps its own clock calls it directly, with its `now`).

    Acting never costs the results: it runs in a savepoint, and a failure there leaves them stored for a person
    (an agent whose batch failed would resend it forever)."""
    record(session, node_id=node_id, node=node, batch_id=batch_id, items=items, now=now)
    directive_ids = {item.directive_id for item in items if item.directive_id}
    try:
        with session.begin_nested():
            return conclude(session, directive_ids=directive_ids, now=now, settings=settings)
    except Exception:
        log.exception("acting on the check results of %s failed; they are stored, a person decides", node)
        return {}


def conclude(session: Session, *, directive_ids: set[str], now: datetime, settings: Settings) -> dict[str, str]:
    """Act on the results of run_checks directives sent for a diagnose decision; directive id -> what was done."""
    done: dict[str, str] = {}
    for raw in sorted(directive_ids):
        try:
            key = uuid.UUID(raw)
        except ValueError:
            continue  # an agent's own id (`faultline check` by hand): no decision waits on it
        directive = session.scalar(select(Directive).where(Directive.id == key).with_for_update())
        params = (directive.params or {}) if directive is not None else {}
        if directive is None or params.get("concluded"):
            continue
        decision = session.get(Decision, params["decision_id"]) if params.get("decision_id") else None
        node = session.get(Node, directive.node_id) if directive.node_id is not None else None
        if node is None or (decision is None and not params.get("return_on_pass")):
            continue  # asked by a person only to look: nothing waits on the answer
        rows = list(session.scalars(select(CheckResult).where(CheckResult.directive_id == raw)))
        outcome = _act(
            session,
            decision=decision,
            node=node,
            rows=rows,
            directive=raw,
            undrain=bool(params.get("undrain")),
            now=now,
            settings=settings,
        )
        directive.params = {**params, "concluded": outcome}
        directive.expires_at = min(directive.expires_at, now)  # answered: no longer delivered
        done[raw] = outcome
        log.info("checks %s on %s: %s", raw, node.name, outcome)
    return done


def _act(
    session: Session,
    *,
    decision: Decision | None,
    node: Node,
    rows: list[CheckResult],
    directive: str,
    undrain: bool,
    now: datetime,
    settings: Settings,
) -> str:
    failed = [r for r in rows if r.verdict == "fail"]
    if decision is None and node.state == "returning":
        return _gate(session, node=node, rows=rows, directive=directive, undrain=undrain, now=now, settings=settings)
    if failed and decision is None:
        return f"checks failed ({', '.join(sorted({r.check for r in failed}))}): the node stays out of service"
    if failed:
        return _remedy(
            session, decision=decision, node=node, failed=failed, directive=directive, now=now, settings=settings
        )
    if any(r.verdict == "refused" for r in rows) or not any(r.verdict == "pass" for r in rows):
        return "no verdict (refused, or nothing could be checked): left to a person"
    passed = sorted({r.check for r in rows if r.verdict == "pass"})
    unavailable = sorted({r.check for r in rows if r.verdict == "not_available"})
    diagnostics = {
        "passed": True,
        "source": "stop-time checks",
        "directive_id": directive,
        "passed_checks": passed,
        "not_available": unavailable,
    }
    try:
        with session.begin_nested():
            nodes.return_to_service(
                session,
                name=node.name,
                reason=f"stop-time checks passed ({len(passed)} checks)",
                diagnostics=diagnostics,
                force=False,
                actor=ACTOR,
                now=now,
                settings=settings,
                source="checks",
            )
    except Conflict as exc:
        return f"checks passed, but the node cannot return: {exc}"
    if decision is not None:
        _undrain(session, decision=decision, node=node, now=now, settings=settings)
    incident = session.get(Incident, decision.incident_id) if decision and decision.incident_id is not None else None
    if incident is not None:
        input_bound = incident.blame == "unknown" and _waited_for_input(session, incident)
        if input_bound:
            # The host side was the suspect (the GPU waited for its input) and the machine passed every check: the
            # job's own input pipeline (its loader, its data) is what is left, the job owner's to look at.
            incident.blame = "user_code"
        incidents.resolve(
            session,
            incident=incident,
            now=now,
            resolution=f"stop-time checks passed on {node.name}: no fault found, node returned"
            + ("; its GPUs waited for the job's own input" if input_bound else ""),
        )
    return "passed: node returned" + (", incident resolved" if incident is not None else "")


def _gate(
    session: Session,
    *,
    node: Node,
    rows: list[CheckResult],
    directive: str,
    undrain: bool,
    now: datetime,
    settings: Settings,
) -> str:
    """The verdict of a returning node's gate, on its locked row (a scheduler's ack may move it meanwhile)."""
    session.refresh(node, with_for_update=True)
    failed = [r for r in rows if r.verdict == "fail"]
    if failed:
        return returns.gate_failed(
            session,
            node=node,
            failed=[(r.id, r.check, r.subject) for r in failed],
            undrain=undrain,
            directive=directive,
            actor=ACTOR,
            now=now,
            settings=settings,
        )
    if any(r.verdict == "refused" for r in rows) or not any(r.verdict == "pass" for r in rows):
        return "no verdict (refused, or nothing could be checked): left to a person"
    passed = sorted({r.check for r in rows if r.verdict == "pass"})
    diagnostics = {
        "passed": True,
        "source": "stop-time checks",
        "directive_id": directive,
        "passed_checks": passed,
        "not_available": sorted({r.check for r in rows if r.verdict == "not_available"}),
    }
    return returns.gate_passed(
        session,
        node=node,
        diagnostics=diagnostics,
        undrain=undrain,
        actor=ACTOR,
        reason=f"return gate passed ({len(passed)} checks)",
        now=now,
        settings=settings,
    )


def _waited_for_input(session: Session, incident: Incident) -> bool:
    """Whether every machine finding of the incident is a GPU less busy than its peers: waiting for its input."""
    rows = session.execute(
        select(Finding.detector, Finding.evidence).where(
            Finding.incident_id == incident.id, Finding.node_id.is_not(None), Finding.role == "cause"
        )
    ).all()
    return bool(rows) and all(
        detector == PEERS and starved((m.get("metric"), m.get("direction")) for m in evidence.get("metrics", []))
        for detector, evidence in rows
    )


def _undrain(session: Session, *, decision: Decision, node: Node, now: datetime, settings: Settings) -> None:
    """The scheduler drained the node for the diagnose decision: it needs a `return` to put it back, also when the
    service never took the node out of service (a diagnose on a node still `healthy` returns nothing above)."""
    pending = session.scalar(
        select(Decision.id).where(
            Decision.node_id == node.id, Decision.kind == "return", Decision.state.in_(("pending", "awaiting_approval"))
        )
    )
    if pending is not None:
        return
    session.add(
        Decision(
            node_id=node.id,
            kind="return",
            state="pending",
            confidence=1.0,
            reason=f"return {node.name}: its stop-time checks for diagnose decision {decision.id} passed"[:1000],
            evidence={"checks": {"diagnose_decision": decision.id}},
            created_at=now,
            expires_at=now + timedelta(seconds=settings.decision_ttl_s),
            actor=ACTOR,
        )
    )
    session.flush()


def _remedy(
    session: Session,
    *,
    decision: Decision,
    node: Node,
    failed: list[CheckResult],
    directive: str,
    now: datetime,
    settings: Settings,
) -> str:
    """Evict the node, or reset its GPU when every failure is one GPU's and the driver state calls for a reset."""
    gpus = {r.subject for r in failed}
    reset = (
        len(gpus) == 1
        and next(iter(gpus)).startswith("gpu:")
        and all(r.evidence.get("action") == "reset_gpu" for r in failed)
    )
    kind, gpu = ("reset_gpu", int(next(iter(gpus)).split(":")[1])) if reset else ("evict", None)
    exists = session.scalar(
        select(Decision.id).where(
            Decision.incident_id == decision.incident_id, Decision.kind == kind, Decision.node_id == node.id
        )
    )
    findings = [r.finding_id for r in failed if r.finding_id is not None]
    if decision.incident_id is not None and findings:
        for finding in session.scalars(select(Finding).where(Finding.id.in_(findings))):
            finding.incident_id = decision.incident_id  # the incident's evidence now holds what the checks found
            finding.job_id = decision.job_id
        incident = session.get(Incident, decision.incident_id)
        if incident is not None:
            incident.blame = "infrastructure"  # the machine failed its checks: the fault is its, not the job's
    if exists is not None:
        return f"checks failed; the incident already has {kind} decision {exists}"
    state = "pending"
    if settings.policy_mode == "shadow":
        state = "shadow"
    elif settings.policy_mode == "approval" or kind in settings.policy_approval_required_for:
        state = "awaiting_approval"
    rails: dict[str, str] = {}
    if state == "pending":  # the fleet circuit breaker may hold it for a person (service/breaker/)
        word = breaker.admit(session, candidates=[(kind, node.name)], now=now, settings=settings)[0]
        rails = {breaker.RAIL: word.rail} if word.rail else {}
        state = "pending" if word.admitted else "awaiting_approval"
    what = "; ".join(f"{r.check} {r.subject}" for r in failed[:5]) + (
        f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    )
    remedy = Decision(
        incident_id=decision.incident_id,
        job_id=decision.job_id,
        node_id=node.id,
        kind=kind,
        gpu=gpu,
        state=state,
        confidence=REMEDY_CONFIDENCE,
        reason=f"stop-time checks failed on {node.name}: {what}"[:1000],
        evidence={
            "checks": {
                "directive_id": directive,
                "diagnose_decision": decision.id,
                "check_results": [r.id for r in failed],
                "findings": findings,
            },
            **({"guard_rails": rails} if rails else {}),
        },
        created_at=now,
        expires_at=now + timedelta(seconds=settings.decision_ttl_s),
    )
    session.add(remedy)
    session.flush()
    bundles.request_for(session, decisions=[remedy], now=now, settings=settings)  # before the node leaves
    return f"checks failed: {kind} decision {remedy.id} ({state})"
