"""The campaign's stop-time checks: a simulated machine sent to `diagnose` answers the service's run_checks
directive with results computed from its fault (lab/sim/checks.py), delivered in-process at simulated time
through the service function the ingest path uses (service/checks/loop.py `accept`), so the service's verdict
(evict, reset_gpu, or return) is what the closed loop then acts on.

Before the first fault every machine goes through an acceptance burn-in (COMMISSION_ROUNDS runs of the level-2
suite, with no directive: nothing waits on them), as a fleet validates machines when they join it. Those passing
figures are the fleet history the service's cut-offs come from (ml/check_criteria.py needs MIN_HISTORY of them
per check and GPU model; below that it falls back to a spec floor only a broken GPU falls under).

Each check answered is recorded as a campaign_scoring.py `CheckRow` for the scoring (`checks_totals`): which
diagnose decision it answered, what the service concluded, and whether the machine carried a fault then.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from lab.evaluation.campaign_scoring import CheckRow
from lab.sim import checks as sim_checks
from lab.sim.model import Cluster
from lab.sim.pool import CHECK
from lab.sim.scenarios import FAULT_KINDS
from service.checks import loop as checks_loop
from service.checks.schemas import CheckResultIn
from service.config import Settings
from service.models import CheckResult, Decision, Directive, Node

COMMISSION_ROUNDS = 3  # 2 GPUs x 6 machines x 3 rounds: past ml/check_criteria.py's MIN_HISTORY of 30


def machine_fault(kind: str) -> bool:
    """A fault of the machine itself: not the user's code (software_slow's runaway loader), not a one-off."""
    k = FAULT_KINDS.get(kind)
    return k is not None and k.blame != "user_code" and k.action != "none" and not k.noise


@dataclass
class Pending:
    directive_id: str
    decision_id: int
    node: str
    level: int
    only: list[str] | None
    due_t: float


class CheckDesk:
    """The campaign's side of run_checks for one job's cluster."""

    def __init__(self, settings: Settings, *, job_id: str, seconds: float) -> None:
        self.settings, self.job_id, self.seconds = settings, job_id, seconds
        self.pending: list[Pending] = []
        self.records: list[CheckRow] = []
        self.commissioned = False
        self.remedies: dict[int, int] = {}  # decision the checks made -> the diagnose decision they answered

    def busy(self, t: float) -> bool:
        """Something to do at `t` (the caller opens a session only then)."""
        return not self.commissioned or any(p.due_t <= t for p in self.pending)

    def tick(self, session: Session, cluster: Cluster, *, t: float, now: datetime) -> list[int]:
        """The burn-in once every machine is known to the service, then the checks due; the new decisions' ids."""
        if not self.commissioned:
            known = set(session.scalars(select(Node.name).where(Node.name.in_(cluster.node_names))))
            if known == set(cluster.node_names):
                self.commission(session, cluster, now)
                self.commissioned = True
        return self.deliver_due(session, cluster, t=t, now=now)

    def commission(self, session: Session, cluster: Cluster, now: datetime) -> None:
        """The acceptance burn-in of every machine: passing figures for the fleet's history."""
        for machine, name in enumerate(cluster.node_names):
            node_id = session.scalar(select(Node.id).where(Node.name == name))
            if node_id is None:
                continue
            for round_ in range(COMMISSION_ROUNDS):
                results = sim_checks.run(cluster, machine, level=2, seed=1000 + round_)
                self._accept(session, node_id, name, sim_checks.wire(results, directive_id=None, ts=now), now)

    def after_ack(self, session: Session, cluster: Cluster, *, decision_id: int, node: str, t: float) -> None:
        """A diagnose decision acknowledged `done`: the run_checks directive the service sent for it. A machine
        the decision found out of service already (in repair: its agent is down) answers nothing: moot."""
        machine = cluster.machine_index(node)
        if machine is None or cluster.place[machine] != CHECK:
            where = cluster.place[machine] if machine is not None else "unknown"
            self.records.append(
                CheckRow(decision_id, self.job_id, node, t, "moot", False, False, conclusion=f"the machine is {where}")
            )
            return
        rows = session.execute(
            select(Directive.id, Directive.params)
            .join(Node, Node.id == Directive.node_id)
            .where(Node.name == node, Directive.kind == "run_checks")
        ).all()
        for directive_id, params in rows:
            params = params or {}
            if params.get("decision_id") == decision_id and not params.get("concluded"):
                self.pending.append(
                    Pending(
                        str(directive_id), decision_id, node, int(params.get("level", 2)), params.get("only"),
                        due_t=t + self.seconds,
                    )
                )  # fmt: skip

    def deliver_due(self, session: Session, cluster: Cluster, *, t: float, now: datetime) -> list[int]:
        """Results of the checks finished by `t`, delivered; the ids of the decisions the service made on them."""
        made: list[int] = []
        for p in [p for p in self.pending if p.due_t <= t]:
            self.pending.remove(p)
            machine = cluster.machine_index(p.node)
            node_id = session.scalar(select(Node.id).where(Node.name == p.node))
            if machine is None or node_id is None:
                continue
            if cluster.place[machine] != CHECK:  # a person took it elsewhere meanwhile: the suite is refused
                items = sim_checks.refused("the machine left its check", directive_id=p.directive_id, ts=now)
            else:
                results = sim_checks.run(cluster, machine, level=p.level, only=p.only, seed=p.decision_id)
                items = sim_checks.wire(results, directive_id=p.directive_id, ts=now)
            before = set(
                session.scalars(select(Decision.id).where(Decision.node_id == node_id, Decision.created_at >= now))
            )
            conclusion = self._accept(session, node_id, p.node, items, now).get(p.directive_id, "not concluded")
            new = session.execute(
                select(Decision.id, Decision.kind, Decision.state).where(
                    Decision.node_id == node_id, Decision.created_at >= now, Decision.id.not_in(before or {0})
                )
            ).all()
            failed = session.scalars(  # the service's verdicts: a figure the agent passed may fail the fleet's cut-off
                select(CheckResult.check).where(
                    CheckResult.directive_id == p.directive_id, CheckResult.verdict == "fail"
                )
            ).all()
            made += [d for d, _, _ in new]
            self.remedies.update({d: p.decision_id for d, _, _ in new})
            remedy = next(((k, s) for _, k, s in new if k in ("evict", "reset_gpu", "return")), None)
            name = cluster.node_names[machine]
            kinds = tuple(sorted({f.kind for f in cluster.faults_on(machine)}))
            self.records.append(
                CheckRow(
                    diagnose_decision=p.decision_id,
                    job_id=self.job_id,
                    node=name,
                    t_s=t,
                    outcome=remedy[0] if remedy else "none",
                    remedy_awaits_approval=bool(remedy and remedy[1] == "awaiting_approval"),
                    faulty=any(machine_fault(k) for k in kinds),
                    fault_kinds=kinds,
                    failed_checks=tuple(sorted(set(failed))),
                    conclusion=conclusion[:300],
                )
            )
        return made

    def _accept(
        self, session: Session, node_id: int, node: str, items: list[dict[str, Any]], now: datetime
    ) -> dict[str, str]:
        # Validated as ingest validates a batch (the soak's simulated time lies within the settings' window).
        parsed = [CheckResultIn.model_validate(item, context=self.settings.time_context) for item in items]
        return checks_loop.accept(
            session, node_id=node_id, node=node, batch_id=uuid.uuid4(), items=parsed, now=now, settings=self.settings
        )
