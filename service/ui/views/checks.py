"""Stop-time checks as the UI shows them: on a node's page, the suites in progress and the latest results with
the service's verdicts; on an incident's page, the checks that answered its diagnose decisions and what the
service concluded from them (service/checks/loop.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session

from service.models import CheckResult, Directive, Node

RESULT_LIMIT = 200


@dataclass
class Suite:
    """One run_checks directive and what came back for it."""

    directive_id: str
    node: str
    level: int
    requested_by: str
    reason: str | None
    created_at: datetime
    expires_at: datetime
    decision_id: int | None
    concluded: str | None  # what the service did with the results (a diagnose decision's, or the repair gate's)
    results: list[CheckResult] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """fail, pass, refused, not_available, or running (nothing back yet) / expired (nothing came back)."""
        verdicts = {r.verdict for r in self.results}
        for v in ("fail", "refused", "pass", "not_available"):
            if v in verdicts:
                return v
        return "running"

    def state(self, now: datetime) -> str:
        return "expired" if not self.results and self.expires_at <= now and not self.concluded else self.verdict

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.verdict == "fail"]


def _suites(session: Session, directives: list[tuple[Directive, str]]) -> list[Suite]:
    ids = [str(d.id) for d, _ in directives]
    results: dict[str, list[CheckResult]] = {}
    if ids:
        rows = session.scalars(
            select(CheckResult)
            .where(CheckResult.directive_id.in_(ids))
            .order_by(CheckResult.subject, CheckResult.check)
        )
        for r in rows:
            results.setdefault(r.directive_id or "", []).append(r)
    out = []
    for d, node in directives:
        params = d.params or {}
        out.append(
            Suite(
                directive_id=str(d.id),
                node=node,
                level=int(params.get("level", 2)),
                requested_by=d.requested_by,
                reason=d.reason,
                created_at=d.created_at,
                expires_at=d.expires_at,
                decision_id=params.get("decision_id"),
                concluded=params.get("concluded"),
                results=results.get(str(d.id), []),
            )
        )
    return out


@dataclass
class NodeChecks:
    running: list[Suite]  # sent, unexpired, nothing back yet
    latest: Suite | None  # the newest suite with results
    by_hand: list[CheckResult]  # the newest results no directive asked for (`faultline check` by hand)


def node_checks(session: Session, *, name: str, now: datetime, limit: int = 20) -> NodeChecks:
    node_id = session.scalar(select(Node.id).where(Node.name == name))
    if node_id is None:
        return NodeChecks([], None, [])
    rows = session.execute(
        select(Directive, Node.name)
        .join(Node, Node.id == Directive.node_id)
        .where(Directive.node_id == node_id, Directive.kind == "run_checks")
        .order_by(Directive.created_at.desc())
        .limit(limit)
    ).all()
    suites = _suites(session, [(d, n) for d, n in rows])
    running = [s for s in suites if not s.results and s.expires_at > now and not s.concluded]
    latest = next((s for s in suites if s.results), None)
    answered = select(cast(Directive.id, Text)).where(Directive.node_id == node_id)
    by_hand = list(
        session.scalars(
            select(CheckResult)
            .where(
                CheckResult.node_id == node_id,
                (CheckResult.directive_id.is_(None)) | (CheckResult.directive_id.not_in(answered)),
            )
            .order_by(CheckResult.ts.desc())
            .limit(RESULT_LIMIT)
        )
    )
    if latest is not None and by_hand and by_hand[0].ts <= max(r.ts for r in latest.results):
        by_hand = []  # older than the latest suite: that one is what the node's checks say now
    return NodeChecks(running, latest, by_hand)


def incident_checks(session: Session, *, diagnose_decisions: list[int]) -> list[Suite]:
    """The checks sent for an incident's diagnose decisions (ids the page holds already), oldest first."""
    if not diagnose_decisions:
        return []  # no query: most incidents have no diagnose decision
    rows = session.execute(
        select(Directive, Node.name)
        .join(Node, Node.id == Directive.node_id)
        .where(Directive.kind == "run_checks", Directive.params["decision_id"].as_integer().in_(diagnose_decisions))
        .order_by(Directive.created_at)
    ).all()
    return _suites(session, [(d, n) for d, n in rows])
